// Collectives through node memory (Communicator::node_segment): each member copies its data into
// its own segment once and the others copy it out, instead of sending it through a transport
// that copies every byte twice (in and out of its buffers). Blocking: a call returns when this
// member is done. Internal to collectives/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "program.h"

namespace meshcast::detail {

// True when every member of `group` maps its segment here and a segment holds at least a
// minimal chunk for each member (the same answer on every member).
bool node_capable(const Group& group);

// all-gatherv of member pieces (elements of `dtype`): the caller's piece from `send` to every
// member's recv at pieces[me] (send may be there already).
void node_all_gatherv(const Group& group, std::size_t me, const void* send, void* recv,
                      const std::vector<Span>& pieces, DType dtype);
// recv (the caller's piece, pieces[me].size() elements) = op over the group of send's
// pieces[me]. recv may be that piece of send (in place).
void node_reduce_scatter(const Group& group, std::size_t me, const void* send, void* recv,
                         const std::vector<Span>& pieces, DType dtype, ReduceOp op);
// recv = op over the group of send (count elements), by the two above; recv may be send.
void node_all_reduce(const Group& group, std::size_t me, const void* send, void* recv,
                     std::int64_t count, DType dtype, ReduceOp op);

}  // namespace meshcast::detail
