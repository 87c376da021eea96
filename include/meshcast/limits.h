// Bounds on what one request may cost, checked before the work starts. Each has a default that
// fits a 24 GiB machine and can be raised (or lowered) with an environment variable
// MESHCAST_MAX_<NAME> (e.g. MESHCAST_MAX_PLAN_OPS=100000000); docs/cli.md lists them.
// A refusal is a ValidationError naming the quantity, its value and the bound.
#pragma once

#include <cstdint>
#include <string>

namespace meshcast {

struct Limits {
  std::int64_t input_file_bytes = std::int64_t{64} << 20;  // a topology, plan, config JSON file
  std::int64_t data_file_bytes = std::int64_t{1} << 30;    // a training corpus (all its files)
  std::int64_t plan_ops = std::int64_t{1} << 24;           // operations of one plan
  std::int64_t plan_memory_bytes = std::int64_t{8} << 30;  // planner's estimated working memory
  // Simulator work: each event re-shares the links among the active flows; counted in the
  // flows' link entries and a heap step per link they touch (20-35 s here at the bound).
  std::int64_t simulate_work = std::int64_t{1} << 31;
  std::int64_t svg_elements = 20000;                         // above: an aggregated picture
  std::int64_t buffer_bytes = std::int64_t{16} << 30;        // one process's tensor buffers
  std::int64_t train_memory_bytes = std::int64_t{16} << 30;  // estimated training memory
  // Arithmetic of a training run's steps (about an hour at the 20 GFLOP/s of 2 cores).
  std::int64_t train_flops = std::int64_t{1} << 46;
  // Configurations a training plan search considers, times the devices, and 40 more per device
  // of those it prices (tens of seconds here at the bound).
  std::int64_t train_search_work = std::int64_t{1} << 31;
  std::int64_t run_bytes = std::int64_t{4} << 40;  // bytes a run moves over all its iterations
  // Transfers a run makes over all its iterations (a reshard's ops, a sync's tensors times their
  // target devices): each costs its setup and completion whatever its bytes (tens of
  // microseconds for a tiny tensor's).
  std::int64_t run_transfers = std::int64_t{1} << 27;
  std::int64_t devices = std::int64_t{1} << 20;  // device ids a job may name (MESHCAST_SIZE)
  std::int64_t local_threads = 1024;             // device threads of the in-process backend
};

// The limits in force: the defaults above, each replaced by MESHCAST_MAX_<NAME> when that is
// set (read once; a malformed value is a ValidationError naming the variable).
const Limits& limits();

// Throws ValidationError(quantity) "<value> exceeds the limit of <bound> (MESHCAST_MAX_<env>)"
// when value > bound.
void check_limit(const std::string& quantity, std::int64_t value, std::int64_t bound,
                 const char* env_name);

// The bytes of a regular input file, read only when it is one and no larger than `max_bytes`:
// a missing or unreadable file is an IoError(field) with the path and the OS reason; a
// directory, FIFO or device is a ValidationError(field); a larger file a ValidationError naming
// its size and the bound.
std::string read_input_file(const std::string& path, const std::string& field,
                            std::int64_t max_bytes);

}  // namespace meshcast
