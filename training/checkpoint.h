// Sharded, atomic, resumable checkpoints of the engine's parameters and AdamW moments.
//
// A checkpoint is a directory DIR/step-NNNNNNNN holding one file per reporting device
// (device-<id>.bin: for every parameter whose tile this device is the first holder of, in the
// device's parameter order, the tile's values, then m, then v, f32 row-major, native byte order)
// and manifest.json (format, step, the caller's description of the run, every parameter's name,
// shape and layout text "MESH:SPEC", every file's size, FNV-1a 64 checksum and per-parameter byte
// offsets, and "checksum": the FNV-1a 64 of the manifest's own canonical JSON text, compact with
// sorted keys, without that key). DIR/latest names the newest one.
//
// Saving writes everything into DIR/step-N.tmp, flushes it to disk, reads it all back (the
// manifest's checksum and every file's size, tiles and checksum), renames it to DIR/step-N and
// only then replaces DIR/latest (itself through a temporary file and a rename) and prunes: a
// process killed at any point leaves the previous checkpoints intact, and a checkpoint that does
// not read back replaces nothing. A checkpoint is never overwritten: saving a step whose
// directory exists is refused. The first device of `world` writes the manifest and does the
// renames. Two checkpoints are kept: the one just saved and the highest-numbered other.
//
// Loading takes the newest checkpoint that reads back whole, the highest-numbered DIR/step-N, so
// that the steps the run saves next exist nowhere yet. DIR/latest names it after every complete
// save; when it does not (missing: the first save was killed between its renames; naming an older
// one: a later save was; or edited by hand), the newest is loaded all the same and
// find_checkpoint() says why. Nothing of the manifest is used before its checksum and the type
// and range of every value are checked; then device k of n checks the size, tiles and checksum of
// every n-th file. A newer checkpoint that fails those checks (disk damage, a half-copied
// directory) gives way to the next older one, and once that one has loaded it is renamed
// DIR/step-N.corrupt, kept for inspection but out of the way of the steps the run saves next;
// LoadStats::passed_over says so. To resume from an older checkpoint on purpose, move the newer
// ones away.
//
// Loading reshards: every parameter moves from its saved layout to this run's layout, all of them
// together as one sync (meshcast::plan_sync over the devices of `world`: each device plans its
// own part, and the boxes that travel between the same devices are coalesced into messages),
// whose source is the files: each saved tile (its value, m and v) is read once, by the device
// that wrote it when that device is in this run, else by another (several tiles merged into one
// when the saved tiles outnumber this run's devices), and sent where this run holds it. So a
// checkpoint resumes on any mesh and parallel configuration of the same model. What a device
// reads is bounded (LoadOptions::batch_bytes): a model larger than that moves in a few batches of
// consecutive parameters, each one sync. Which model it is (beyond its parameters' names and
// shapes) is the caller's to check against the description: see find_checkpoint().
//
// Each step that can fail ends with Communicator::agree over `world`: when any device failed,
// every device throws the failure of the first in `world` order. `world` is the communicator's
// world (Communicator::world) or else a group that every device of the communicator makes, as
// Communicator::group requires.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "meshcast/communicator.h"
#include "training/parameters.h"

namespace meshcast::training {

// Saves `params` (this device's) as step `step`. Collective over `world` (every device of the
// run, each with its own Parameters, this device included). `description` (JSON text; empty:
// null) goes into the manifest; invalid JSON throws ValidationError("checkpoint.description"),
// an existing DIR/step-N ValidationError("checkpoint.step"). Throws IoError("checkpoint", ...)
// when the directory cannot be written or what was written does not read back (every device
// throws).
void save_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                     std::int64_t step, const std::string& dir, const std::string& description);

// Refuses, before a run trains, checkpoints whose manifest (every device's offsets of every
// parameter it holds) would be larger than a load reads: MESHCAST_MAX_INPUT_FILE_BYTES, and the
// JSON values a manifest may hold. Otherwise the first save would fail after the steps before it.
// Collective over `world`, as saving; ValidationError("checkpoint", ...) on every device.
void check_checkpoint_size(Communicator& comm, const std::vector<int>& world, Parameters& params,
                           const std::string& description);

struct LoadOptions {
  // The bytes of saved tiles (values and moments, as read from the files) that a device holds
  // for one sync: the parameters move in batches of consecutive ones (in the manifest's order)
  // whose tiles on any device take at most this much, one sync each, the next batch read while
  // the previous one moves (so twice this in all; a parameter larger than it is a batch alone).
  // The sync's own staging is bounded apart (meshcast::SyncOptions::max_staging_bytes).
  std::int64_t batch_bytes = std::int64_t{128} << 20;
  // Called on every device with the checkpoint chosen (its path and description), its files
  // verified, before anything moves; what it throws refuses the load on every device. A
  // caller's check of which model a checkpoint holds belongs here too: the one loaded is older
  // than find_checkpoint()'s when the newer one's files turn out corrupt.
  std::function<void(const std::string& path, const std::string& description)> accept;
};

// What a load did on this device.
struct LoadStats {
  std::int64_t tensors = 0;   // parameters moved (every device counts all of them)
  std::int64_t batches = 0;   // syncs, one plan_sync each (the same on every device)
  std::int64_t messages = 0;  // this device's messages over them (meshcast::SyncStats)
  // Newer checkpoints found corrupt and passed over, each "PATH is corrupt (why); moved to
  // PATH.corrupt"
  std::vector<std::string> passed_over;
};

// Loads DIR's newest good checkpoint into `params` (values, m, v; gradients untouched) and
// returns its step, or -1 when DIR has none (no step directory and no DIR/latest). Collective
// over `world`, every device with the same `options`; `stats` (when given) says what it did.
// Throws ValidationError("checkpoint", ...) naming the file of the newest when every checkpoint
// is corrupt or partial (missing file, size, tile or checksum mismatch, an edited or unreadable
// manifest), for a DIR/latest whose checkpoints are gone, or for one of another model (a
// parameter missing on either side or of another shape); every device throws, and neither the
// disk nor `params` is modified. ValidationError("checkpoint.batch_bytes") when it is below 1;
// ValidationError("train memory") when the newest manifest's layouts (4 KiB a parameter, 16
// bytes a device of its mesh) exceed limits().train_memory_bytes: not passed over (it is whole).
std::int64_t load_checkpoint(Communicator& comm, const std::vector<int>& world, Parameters& params,
                             const std::string& dir, const LoadOptions& options = {},
                             LoadStats* stats = nullptr);

// The checkpoint load_checkpoint() would load, its manifest checked (not its data files: a
// corrupt data file makes the load pass over it too).
struct SavedCheckpoint {
  std::int64_t step = -1;            // -1: DIR holds no checkpoint
  std::string path;                  // DIR/step-NNNNNNNN
  std::string description;           // as given to save_checkpoint() (JSON text)
  std::string fallback;              // why DIR/latest does not name it, in words; "" when it does
  std::vector<std::string> skipped;  // why each newer checkpoint's manifest was passed over
};

// Reads DIR without loading anything (one process, no communicator), so that a trainer can
// compare the description with its own run before it allocates or trains. Throws as
// load_checkpoint() does for the manifest.
SavedCheckpoint find_checkpoint(const std::string& dir);

}  // namespace meshcast::training
