// Sharded, atomic, resumable checkpoints of the engine's parameters and AdamW moments.
//
// A checkpoint is a directory DIR/step-NNNNNNNN holding one file per reporting device
// (device-<id>.bin: for every parameter whose tile this device is the first holder of, in the
// device's parameter order, the tile's values, then m, then v, f32 row-major, native byte order)
// and manifest.json (format, step, the caller's description of the run, every parameter's name,
// shape and layout text "MESH:SPEC", every file's size, FNV-1a 64 checksum and per-parameter byte
// offsets). DIR/latest names the newest complete one. Saving writes everything into
// DIR/step-N.tmp, flushes it to disk, renames it to DIR/step-N (re-saving a step exchanges the
// two directories atomically where the file system can) and only then replaces DIR/latest
// (itself through a temporary file and a rename): a process killed at any point leaves the
// previous checkpoint and DIR/latest intact. The first device of `world` writes the manifest and
// does the renames. Two checkpoints are kept: the one just saved and the highest-numbered other.
//
// Loading reshards: every parameter is planned from its saved layout to this run's layout with
// meshcast (send/recv, each box from its first holder: the device whose file has it), and each
// device executes its part of that plan as reads from the files (only the rows of a saved tile
// that a box spans), so a checkpoint resumes on any mesh and parallel configuration of the same
// model. Device k of n checks the sizes and checksums of every n-th file first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshcast/communicator.h"
#include "training/parameters.h"

namespace meshcast::training {

// Saves `params` (this device's) as step `step`. Collective over `world` (every device of the
// run, each with its own Parameters, this device included). `description` (JSON text; empty:
// null) goes into the manifest; invalid JSON throws ValidationError("checkpoint.description").
// Throws IoError("checkpoint", ...) when the directory cannot be written (every device throws).
void save_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                     std::int64_t step, const std::string& dir, const std::string& description);

// Loads DIR/latest into `params` (values, m, v; gradients untouched) and returns its step, or
// -1 when DIR has no checkpoint (no DIR/latest). Collective over `world`. Throws
// ValidationError("checkpoint", ...) naming the file for a corrupt or partial checkpoint
// (missing file, size or checksum mismatch, unreadable manifest) or one of another model (a
// parameter missing on either side or of another shape); every device throws, and neither the
// disk nor `params` is modified.
std::int64_t load_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                             const std::string& dir);

}  // namespace meshcast::training
