// Checkpoints: saved under one parallel configuration and loaded under another, every element of
// the values and AdamW moments comes back exactly; saving is atomic, keeps the two newest and
// never overwrites one; loading takes the newest (saying why when DIR/latest does not name it),
// passes over a corrupt newer one to the next older good one (moving it aside), and refuses a
// corrupt, partial, edited or foreign checkpoint with no good one behind it, or a foreign one, on
// every device and changes nothing.
#include "training/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "meshcast/error.h"
#include "meshcast/local.h"

namespace mt = meshcast::training;
namespace fs = std::filesystem;
using meshcast::Communicator;

namespace {

using Sp = mt::Split;

// A parameter of the test model, in the engine's kinds; `part` 0 lives on the first pipeline
// stage, 1 on the last; `tag` makes its values distinct from every other parameter's.
struct Spec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<Sp> split;
  mt::Init init;
  bool sharded;
  int part;
  int tag;
};

constexpr std::int64_t d = 8, vocab = 12;

std::vector<Spec> model() {
  return {
      {"embed.table", {vocab, d}, {Sp::None, Sp::Rows}, mt::Init::Normal, false, 0, 1},
      {"block0.qkv.w", {d, 3 * d}, {Sp::Rows, Sp::Cols}, mt::Init::Normal, true, 0, 2},
      {"block0.qkv.b", {3 * d}, {Sp::Cols}, mt::Init::Zeros, false, 0, 3},
      {"block0.out.w", {3 * d, d}, {Sp::Cols, Sp::Rows}, mt::Init::Normal, true, 1, 4},
      {"head.ln.g", {d}, {Sp::Rows}, mt::Init::Ones, false, 1, 5},
      {"head.w", {d, vocab}, {Sp::Rows, Sp::None}, mt::Init::Normal, false, 1, 6},
  };
}

// Many small parameters: the test model's kinds, of uneven shapes, each with its own tag.
std::vector<Spec> many() {
  const auto kinds = model();
  std::vector<Spec> specs;
  for (int k = 0; k < 60; ++k) {
    Spec s = kinds[static_cast<std::size_t>(k) % kinds.size()];
    s.name = "many" + std::to_string(k) + "." + s.name;
    for (auto& n : s.shape) n = n / 2 + 1 + k % 5;
    s.tag = 100 + k;
    specs.push_back(s);
  }
  return specs;
}

mt::ParallelConfig parallel(const std::vector<std::string>& stages) {
  mt::ParallelConfig p;
  p.stages.clear();
  for (const auto& s : stages) p.stages.push_back(mt::parse_stage_shape(s));
  return p;
}

// One device's parameters: its stage's part of the model, as the engine would add them.
struct Device {
  Device(int me, const mt::ParallelConfig& parallel, const std::vector<Spec>& specs)
      : place(mt::place_of(me, parallel)), params(place, mt::TrainConfig{}, mt::ModelConfig{}) {
    const auto stages = static_cast<int>(parallel.stages.size());
    for (const Spec& s : specs)
      if (s.part * stages / 2 == place.stage)
        params.add(s.name, s.shape, s.split, s.init, s.sharded);
  }
  mt::Place place;
  mt::Parameters params;
};

// fn(local, global) for every element of `box` (local: row-major in the box; global: the flat
// index in the full tensor of `shape`).
template <class F>
void for_each_element(const meshcast::Box& box, const std::vector<std::int64_t>& shape, F fn) {
  const std::int64_t cols = shape.size() == 2 ? shape[1] : 1;
  const meshcast::Range span = shape.size() == 2 ? box[1] : meshcast::Range{0, 1};
  std::int64_t local = 0;
  for (std::int64_t i = box[0].lo; i < box[0].hi; ++i)
    for (std::int64_t j = span.lo; j < span.hi; ++j) fn(local++, i * cols + j);
}

int tag_of(const std::string& name) {
  static const std::map<std::string, int> tags = [] {
    std::map<std::string, int> out;
    for (const auto& specs : {model(), many()})
      for (const Spec& s : specs) out[s.name] = s.tag;
    return out;
  }();
  const auto it = tags.find(name);
  return it == tags.end() ? 99 : it->second;
}

// The value saved at `salt` (exact in f32); m is twice it, v three times.
float expected(const std::string& name, std::int64_t global, int salt) {
  return static_cast<float>(tag_of(name) * 1000 + global) + 0.5f * static_cast<float>(salt);
}

void perturb(mt::Parameters& params, int salt) {
  for (auto& p : params.all())
    for_each_element(p.shard, p.shape, [&](std::int64_t i, std::int64_t g) {
      const auto k = static_cast<std::size_t>(i);
      p.value[k] = expected(p.name, g, salt);
      p.m[k] = 2 * p.value[k];
      p.v[k] = 3 * p.value[k];
    });
}

// What each device threw, by device id: "" for nothing, else "V " / "I " (ValidationError /
// IoError) and what().
using Outcomes = std::vector<std::string>;

Outcomes run(const mt::ParallelConfig& parallel,
             const std::function<void(Communicator&, const std::vector<int>&)>& fn) {
  const int n = parallel.devices();
  std::vector<int> world(static_cast<std::size_t>(n));
  std::iota(world.begin(), world.end(), 0);
  Outcomes out(world.size());
  meshcast::LocalWorld w(n);
  w.run([&](Communicator& comm) {
    std::string& o = out[static_cast<std::size_t>(comm.rank())];
    try {
      fn(comm, world);
    } catch (const meshcast::ValidationError& e) {
      o = std::string("V ") + e.what();
    } catch (const meshcast::IoError& e) {
      o = std::string("I ") + e.what();
    } catch (const std::exception& e) {
      o = std::string("? ") + e.what();
    }
  });
  return out;
}

void expect_ok(const Outcomes& outcomes) {
  for (std::size_t i = 0; i < outcomes.size(); ++i) EXPECT_EQ(outcomes[i], "") << "device " << i;
}

// Every device threw the same kind (`kind` "V " or "I ") with `needle` in its message.
void expect_all_threw(const Outcomes& outcomes, const std::string& kind,
                      const std::string& needle) {
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].substr(0, 2), kind) << "device " << i << ": " << outcomes[i];
    EXPECT_NE(outcomes[i].find(needle), std::string::npos)
        << "device " << i << ": " << outcomes[i] << " (expected " << needle << ")";
  }
}

void save(const mt::ParallelConfig& parallel, const std::string& dir, std::int64_t step, int salt,
          const std::vector<Spec>& specs = model()) {
  expect_ok(run(parallel, [&](Communicator& comm, const std::vector<int>& world) {
    Device dev(comm.rank(), parallel, specs);
    perturb(dev.params, salt);
    mt::save_checkpoint(comm, world, dev.params, step, dir, R"({"run": "checkpoint_test"})");
  }));
}

// Loads into fresh parameters under `parallel` and checks every element against the values
// saved at `salt`; returns what each device says the load did.
std::vector<mt::LoadStats> expect_loads(const mt::ParallelConfig& parallel, const std::string& dir,
                                        std::int64_t step, int salt,
                                        const std::vector<Spec>& specs = model(),
                                        const mt::LoadOptions& options = {}) {
  std::vector<mt::LoadStats> stats(static_cast<std::size_t>(parallel.devices()));
  expect_ok(run(parallel, [&](Communicator& comm, const std::vector<int>& world) {
    Device dev(comm.rank(), parallel, specs);
    EXPECT_EQ(mt::load_checkpoint(comm, world, dev.params, dir, options,
                                  &stats[static_cast<std::size_t>(comm.rank())]),
              step);
    for (const auto& p : dev.params.all()) {
      ASSERT_EQ(p.value.size(), static_cast<std::size_t>(p.shard.volume()));
      std::int64_t wrong = 0;
      for_each_element(p.shard, p.shape, [&](std::int64_t i, std::int64_t g) {
        const auto k = static_cast<std::size_t>(i);
        const float f = expected(p.name, g, salt);
        wrong += (p.value[k] != f) + (p.m[k] != 2 * f) + (p.v[k] != 3 * f);
      });
      EXPECT_EQ(wrong, 0) << p.name << " on device " << comm.rank();
    }
  }));
  return stats;
}

// Every file under `dir` (relative path -> contents), to tell whether anything changed.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    std::string& s = out[fs::relative(e.path(), dir).string()];
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    s = text.str();
  }
  return out;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_file(path)); }

// The manifest's checksum as the format defines it: FNV-1a 64 of the compact JSON text (keys
// sorted) without the "checksum" key. Recomputed after an edit, it forges a manifest that only
// the checks of its values can refuse.
std::string checksum_of(nlohmann::json manifest) {
  manifest.erase("checksum");
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : manifest.dump()) h = (h ^ c) * 0x100000001b3ULL;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// Edits the manifest of checkpoint `c` with `edit`; `reseal` recomputes its checksum.
void edit_manifest(const fs::path& c, const std::function<void(nlohmann::json&)>& edit,
                   bool reseal) {
  auto j = read_json(c / "manifest.json");
  edit(j);
  if (reseal) j["checksum"] = checksum_of(j);
  write_file(c / "manifest.json", j.dump(2) + "\n");
}

// The first parameter of the first file in the manifest `j` with a non-zero offset.
nlohmann::json& some_offset(nlohmann::json& j) {
  for (auto& [name, offset] : j["files"][0]["offsets"].items())
    if (offset != 0) return offset;
  throw std::logic_error("no offset to edit");
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/meshcast-checkpoint-XXXXXX";
    ASSERT_NE(mkdtemp(name), nullptr);
    root_ = name;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string dir(const std::string& name) const { return (fs::path(root_) / name).string(); }

  std::string root_;
};

TEST_F(Checkpoint, ReshardsAcrossParallelConfigurations) {
  struct Case {
    std::vector<std::string> saved, loaded;
  };
  const std::vector<Case> cases = {
      {{"dp=2,grid=2x2x1"}, {"dp=1,grid=1x2x2"}},
      {{"dp=2,grid=2x2x1"}, {"dp=1"}},
      {{"dp=2,grid=2x2x1"}, {"dp=2,tp=2", "dp=1,grid=2x1x2"}},
      {{"dp=1,grid=2x1x2", "dp=2,grid=1x2x1"}, {"dp=2,grid=2x2x1"}},
      {{"dp=1,grid=2x1x2", "dp=2,grid=1x2x1"}, {"dp=1,grid=3x1x1"}},
      {{"dp=1"}, {"dp=1,grid=3x2x1", "dp=1,grid=1x1x3"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "case " << i);
    const std::string where = dir("case" + std::to_string(i++));
    save(parallel(c.saved), where, 7, 1);
    expect_loads(parallel(c.loaded), where, 7, 1);
  }
}

// A load plans all its parameters as one sync (per batch): each device sends its parts of many
// parameters to a receiver in a few coalesced messages, not one per parameter.
TEST_F(Checkpoint, LoadsManyParametersAsOneSync) {
  const auto specs = many();
  const auto count = static_cast<std::int64_t>(specs.size());
  const std::string where = dir("many");
  save(parallel({"dp=1"}), where, 5, 2, specs);  // device 0 writes every tile
  const auto stats = expect_loads(parallel({"dp=2,tp=2"}), where, 5, 2, specs);
  for (std::size_t i = 0; i < stats.size(); ++i) {
    EXPECT_EQ(stats[i].tensors, count) << "device " << i;
    EXPECT_EQ(stats[i].batches, 1) << "device " << i;
  }
  // Device 0 reads every tile and sends the 3 others their parts of all 60 parameters: at most
  // one message to each set of receivers among them (the bytes fit in one).
  EXPECT_GT(stats[0].messages, 0);
  EXPECT_LE(stats[0].messages, 7);
}

// A load whose sources exceed LoadOptions::batch_bytes syncs in several batches of consecutive
// parameters, every element still where it belongs; a bound below 1 is refused on every device.
TEST_F(Checkpoint, LoadsInBatchesOfBoundedSourceBytes) {
  const auto specs = many();
  const auto count = static_cast<std::int64_t>(specs.size());
  const std::string where = dir("batches");
  save(parallel({"dp=2,grid=2x2x1"}), where, 5, 3, specs);
  // A few small parameters a batch; the larger ones alone.
  const auto loaded = parallel({"dp=1,grid=1x2x2", "dp=2"});
  const auto stats = expect_loads(loaded, where, 5, 3, specs, {.batch_bytes = 2048, .accept = {}});
  for (std::size_t i = 0; i < stats.size(); ++i) {
    EXPECT_EQ(stats[i].tensors, count) << "device " << i;
    EXPECT_GT(stats[i].batches, 1) << "device " << i;
    EXPECT_LT(stats[i].batches, count) << "device " << i;
    EXPECT_EQ(stats[i].batches, stats[0].batches) << "device " << i;
  }
  expect_all_threw(run(loaded,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), loaded, specs);
                         mt::load_checkpoint(comm, world, dev.params, where,
                                             {.batch_bytes = 0, .accept = {}});
                       }),
                   "V ", "checkpoint.batch_bytes");
}

TEST_F(Checkpoint, RoundTripIsBitExact) {
  const auto config = parallel({"dp=2,grid=1x2x2"});
  // Arbitrary bit patterns of a trained state (denormals, -0 and the extremes included; no NaN
  // or infinity, no negative second moment: see SavesNoStateThatTrainingCannotLeave), equal on
  // the replicas of a tile.
  auto bits = [](const std::string& name, std::int64_t g, int which) {
    std::uint64_t x = (static_cast<std::uint64_t>(tag_of(name)) << 40) ^
                      (static_cast<std::uint64_t>(g) << 2) ^ static_cast<std::uint64_t>(which);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    auto u = static_cast<std::uint32_t>(x ^ (x >> 31));
    if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x00800000u;  // the largest exponent, finite
    if (which == 2) u &= 0x7fffffffu;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  const std::string where = dir("bits");
  expect_ok(run(config, [&](Communicator& comm, const std::vector<int>& world) {
    Device saved(comm.rank(), config, model());
    for (auto& p : saved.params.all())
      for_each_element(p.shard, p.shape, [&](std::int64_t i, std::int64_t g) {
        const auto k = static_cast<std::size_t>(i);
        p.value[k] = bits(p.name, g, 0);
        p.m[k] = bits(p.name, g, 1);
        p.v[k] = bits(p.name, g, 2);
      });
    mt::save_checkpoint(comm, world, saved.params, 3, where, "");

    Device loaded(comm.rank(), config, model());
    for (auto& p : loaded.params.all()) std::fill(p.grad.begin(), p.grad.end(), 7.0f);
    EXPECT_EQ(mt::load_checkpoint(comm, world, loaded.params, where), 3);
    auto a = saved.params.all().begin();
    for (const auto& p : loaded.params.all()) {
      const auto bytes = p.value.size() * sizeof(float);
      ASSERT_EQ(p.value.size(), a->value.size());
      EXPECT_EQ(std::memcmp(p.value.data(), a->value.data(), bytes), 0) << p.name;
      EXPECT_EQ(std::memcmp(p.m.data(), a->m.data(), bytes), 0) << p.name;
      EXPECT_EQ(std::memcmp(p.v.data(), a->v.data(), bytes), 0) << p.name;
      EXPECT_TRUE(std::all_of(p.grad.begin(), p.grad.end(), [](float g) { return g == 7.0f; }))
          << p.name << ": gradients touched";
      ++a;
    }
  }));
}

TEST_F(Checkpoint, SavesAtomicallyAndKeepsTheTwoNewest) {
  const auto config = parallel({"dp=2,grid=2x1x1"});
  const std::string where = dir("atomic");
  save(config, where, 1, 1);
  const auto manifest =
      nlohmann::json::parse(read_file(fs::path(where) / "step-00000001" / "manifest.json"));
  EXPECT_EQ(manifest["step"], 1);
  EXPECT_EQ(manifest["description"]["run"], "checkpoint_test");
  EXPECT_EQ(manifest["parameters"].size(), model().size());

  // A save killed before its rename, and one killed before replacing DIR/latest.
  fs::create_directory(fs::path(where) / "step-00000002.tmp");
  write_file(fs::path(where) / "step-00000002.tmp" / "manifest.json", "{garbage");
  write_file(fs::path(where) / "step-00000002.tmp" / "device-0.bin", "garbage");
  write_file(fs::path(where) / "latest.tmp", "step-00000002\n");
  expect_loads(config, where, 1, 1);

  save(config, where, 2, 2);
  EXPECT_EQ(entries(where), (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
  EXPECT_EQ(read_file(fs::path(where) / "latest"), "step-00000002\n");
  expect_loads(config, where, 2, 2);

  save(config, where, 3, 3);
  EXPECT_EQ(entries(where), (std::vector<std::string>{"latest", "step-00000002", "step-00000003"}));
  expect_loads(config, where, 3, 3);

  // Saving a step again is refused on every device and changes nothing.
  const auto before = snapshot(where);
  expect_all_threw(run(config,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), config, model());
                         mt::save_checkpoint(comm, world, dev.params, 3, where, "");
                       }),
                   "V ", "checkpoint.step: " + where + "/step-00000003 exists");
  EXPECT_EQ(snapshot(where), before);
  expect_loads(config, where, 3, 3);
}

TEST_F(Checkpoint, RefusesACorruptCheckpointOnEveryDevice) {
  const auto config = parallel({"dp=1,grid=2x2x1"});
  struct Case {
    std::string what;
    std::function<void(const fs::path&)> corrupt;  // given the checkpoint's directory
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"flipped byte",
       [](const fs::path& c) {
         std::string s = read_file(c / "device-1.bin");
         s[s.size() / 2] = static_cast<char>(s[s.size() / 2] ^ 0x10);
         write_file(c / "device-1.bin", s);
       },
       "device-1.bin: checksum mismatch"},
      {"truncated file", [](const fs::path& c) { fs::resize_file(c / "device-2.bin", 40); },
       "device-2.bin: size 40"},
      {"missing file", [](const fs::path& c) { fs::remove(c / "device-3.bin"); }, "device-3.bin"},
      {"missing manifest", [](const fs::path& c) { fs::remove(c / "manifest.json"); },
       "manifest.json"},
      {"garbled manifest", [](const fs::path& c) { write_file(c / "manifest.json", "{\"for"); },
       "manifest.json"},
      {"missing checkpoint", [](const fs::path& c) { fs::remove_all(c); },
       "holds no checkpoint directory"},
      {"a directory for a file",
       [](const fs::path& c) {
         fs::remove(c / "device-0.bin");
         fs::create_directory(c / "device-0.bin");
       },
       "device-0.bin: not a regular file"},
      // A FIFO would block a reader that opened it plainly.
      {"a FIFO for the manifest",
       [](const fs::path& c) {
         fs::remove(c / "manifest.json");
         ASSERT_EQ(mkfifo((c / "manifest.json").c_str(), 0644), 0);
       },
       "manifest.json: not a regular file"},
      {"duplicate key in the manifest",
       [](const fs::path& c) {
         std::string s = read_file(c / "manifest.json");
         s.insert(s.find('{') + 1, "\"step\": 5,");
         write_file(c / "manifest.json", s);
       },
       "key 'step' appears twice"},
      // One character of the manifest: the data would be read from 4 bytes further on.
      {"shifted offset",
       [](const fs::path& c) {
         edit_manifest(
             c, [](nlohmann::json& j) { some_offset(j) = some_offset(j).get<int>() + 4; }, false);
       },
       "manifest.json: checksum mismatch"},
      {"swapped offsets",
       [](const fs::path& c) {
         edit_manifest(
             c,
             [](nlohmann::json& j) {
               auto& offsets = j["files"][1]["offsets"];
               auto first = offsets.begin(), second = std::next(first);
               std::swap(*first, *second);
             },
             false);
       },
       "manifest.json: checksum mismatch"},
      {"edited description",
       [](const fs::path& c) {
         edit_manifest(
             c, [](nlohmann::json& j) { j["description"]["run"] = "another"; }, false);
       },
       "manifest.json: checksum mismatch"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string where = dir("corrupt" + std::to_string(i++));
    save(config, where, 5, 1);
    c.corrupt(fs::path(where) / "step-00000005");
    const auto before = snapshot(where);
    expect_all_threw(run(config,
                         [&](Communicator& comm, const std::vector<int>& world) {
                           Device dev(comm.rank(), config, model());
                           const auto untouched = dev.params.all().front().value;
                           try {
                             mt::load_checkpoint(comm, world, dev.params, where);
                           } catch (...) {
                             EXPECT_EQ(dev.params.all().front().value, untouched);
                             throw;
                           }
                         }),
                     "V ", c.needle);
    EXPECT_EQ(snapshot(where), before);
  }
}

// A manifest whose checksum was recomputed after an edit (a tool's bug, or a forgery): every value
// is checked before it is used.
TEST_F(Checkpoint, RefusesAResealedInconsistentManifest) {
  const auto config = parallel({"dp=1,grid=2x2x1"});
  using Json = nlohmann::json;
  const std::vector<std::pair<std::function<void(Json&)>, std::string>> cases = {
      {[](Json& j) { some_offset(j) = some_offset(j).get<int>() + 4; }, "a gap or overlap"},
      {[](Json& j) { some_offset(j) = 1 << 30; }, "a gap or overlap"},
      {[](Json& j) { some_offset(j) = -4; }, "is not an integer in 0.."},
      {[](Json& j) { j["files"][0]["bytes"] = j["files"][0]["bytes"].get<int>() + 12; },
       "the manifest says"},
      {[](Json& j) { j["files"][0]["name"] = "../device-0.bin"; }, "is not named device-"},
      {[](Json& j) { j["files"][1] = j["files"][0]; }, "device-0.bin is listed twice"},
      // Found only when device 0 reads its tiles for the move: the others, which read theirs,
      // fail with it.
      {[](Json& j) { j["files"].erase(0); }, "its files do not cover"},
      {[](Json& j) { j["files"][0]["offsets"]["nowhere"] = 0; },
       "parameter nowhere is not in the manifest"},
      {[](Json& j) { j["parameters"].push_back(j["parameters"][0]); },
       "parameter embed.table is listed twice"},
      {[](Json& j) { j["parameters"][0]["layout"] = "2x2@0-3:S0S0"; }, "parameter embed.table"},
      {[](Json& j) { j["step"] = 6; }, "its step is not 5"},
      {[](Json& j) { j["step"] = "5"; }, "is not an integer"},
      // Past a training step's int (it once wrapped to a negative step and ran for ever).
      {[](Json& j) { j["step"] = std::int64_t{1} << 31; }, "is not an integer in 0..2147483647"},
      {[](Json& j) { j["format"] = "meshcast-checkpoint-1"; }, "not a meshcast-checkpoint-2"},
      {[](Json& j) { j.erase("files"); }, "manifest.json"},
  };
  int i = 0;
  for (const auto& [edit, needle] : cases) {
    SCOPED_TRACE(needle);
    const std::string where = dir("forged" + std::to_string(i++));
    save(config, where, 5, 1);
    edit_manifest(fs::path(where) / "step-00000005", edit, true);
    expect_all_threw(run(config,
                         [&](Communicator& comm, const std::vector<int>& world) {
                           Device dev(comm.rank(), config, model());
                           mt::load_checkpoint(comm, world, dev.params, where);
                         }),
                     "V ", needle);
  }
}

// DIR/latest names the newest checkpoint after every save; when it does not, the newest is loaded
// all the same (a resumed run then saves no step that exists) and find_checkpoint() says why.
TEST_F(Checkpoint, LoadsTheNewestAndSaysWhyWhenLatestDoesNot) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  const std::string where = dir("newest");
  save(config, where, 4, 1);
  save(config, where, 5, 2);
  const fs::path latest = fs::path(where) / "latest";
  const auto found = mt::find_checkpoint(where);
  EXPECT_EQ(found.step, 5);
  EXPECT_EQ(found.path, where + "/step-00000005");
  EXPECT_EQ(found.fallback, "");
  EXPECT_EQ(nlohmann::json::parse(found.description)["run"], "checkpoint_test");

  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { fs::remove(latest); }, "latest is missing"},
      {[&] { write_file(latest, "step-00000004\n"); }, "names 'step-00000004', not the newest"},
      {[&] { write_file(latest, "garbage"); }, "names 'garbage', not the newest"},
      {[&] {
         fs::remove(latest);
         fs::create_directory(latest);
       },
       "latest: not a regular file"},
  };
  for (const auto& [damage, needle] : cases) {
    SCOPED_TRACE(needle);
    damage();
    const auto f = mt::find_checkpoint(where);
    EXPECT_EQ(f.step, 5);
    EXPECT_NE(f.fallback.find(needle), std::string::npos) << f.fallback;
    expect_loads(config, where, 5, 2);
    fs::remove_all(latest);
    write_file(latest, "step-00000005\n");
  }
}

// A newest checkpoint that does not read back (a data file or the manifest damaged) gives way to
// the next older good one, which loads exactly, and is moved aside so that the resumed run can
// save its step again; when every checkpoint is corrupt, the newest's failure is the error.
TEST_F(Checkpoint, FallsBackToTheNewestGoodCheckpoint) {
  const auto config = parallel({"dp=1,grid=2x2x1"});
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"device-2.bin", "device-2.bin: checksum mismatch"}, {"manifest.json", "manifest.json"}};
  int i = 0;
  for (const auto& [file, needle] : damages) {
    SCOPED_TRACE(file);
    const std::string where = dir("fallback" + std::to_string(i++));
    save(config, where, 3, 1);
    save(config, where, 6, 2);
    save(config, where, 9, 3);
    const fs::path newest = fs::path(where) / "step-00000009";
    std::string bytes = read_file(newest / file);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
    write_file(newest / file, bytes);
    // The manifest is checked before any run starts; a data file only by the load.
    const auto found = mt::find_checkpoint(where);
    EXPECT_EQ(found.step, file == "manifest.json" ? 6 : 9);
    EXPECT_EQ(found.skipped.size(), file == "manifest.json" ? 1u : 0u);
    for (const auto& stats : expect_loads(parallel({"dp=2,grid=1x1x1"}), where, 6, 2)) {
      ASSERT_EQ(stats.passed_over.size(), 1u);
      EXPECT_NE(stats.passed_over[0].find(needle), std::string::npos) << stats.passed_over[0];
      EXPECT_NE(stats.passed_over[0].find("moved to " + newest.string() + ".corrupt"),
                std::string::npos)
          << stats.passed_over[0];
    }
    EXPECT_FALSE(fs::exists(newest));
    EXPECT_EQ(read_file(fs::path(newest.string() + ".corrupt") / file), bytes);
    EXPECT_EQ(mt::find_checkpoint(where).step, 6);
    save(config, where, 9, 4);  // the step can be saved again
    expect_loads(config, where, 9, 4);
  }
  // Every checkpoint corrupt: the newest's failure, on every device, and nothing moved.
  const std::string where = dir("fallback-none");
  save(config, where, 3, 1);
  save(config, where, 6, 2);
  for (const char* step : {"step-00000003", "step-00000006"})
    fs::resize_file(fs::path(where) / step / "device-1.bin", 8);
  const auto before = snapshot(where);
  expect_all_threw(run(config,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), config, model());
                         mt::load_checkpoint(comm, world, dev.params, where);
                       }),
                   "V ", "step-00000006/device-1.bin: size 8");
  EXPECT_EQ(snapshot(where), before);
}

// A device verifies every file it reads: one that another device verified (tp=4 saved, tp=2
// loaded: device 0 reads devices 0 and 1's files, device 1 verified the latter) is checked
// again before device 0 reads it, so a file that differs from what the other device saw (a
// node-local copy; here changed under the load) is refused on every device, not loaded.
TEST_F(Checkpoint, EveryDeviceVerifiesWhatItReads) {
  const std::string where = dir("reader");
  save(parallel({"dp=1,tp=4"}), where, 3, 1);
  const auto loaded = parallel({"dp=1,tp=2"});
  const fs::path file = fs::path(where) / "step-00000003" / "device-1.bin";
  expect_all_threw(run(loaded,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), loaded, model());
                         mt::LoadOptions options;
                         // After every file was verified, before anything is read.
                         options.accept = [&](const std::string&, const std::string&) {
                           if (comm.rank() != 0) return;
                           std::string bytes = read_file(file);
                           bytes.back() = static_cast<char>(bytes.back() ^ 0x01);
                           write_file(file, bytes);
                         };
                         mt::load_checkpoint(comm, world, dev.params, where, options);
                       }),
                   "V ", "device-1.bin: checksum mismatch");
}

// LoadOptions::accept sees the checkpoint loaded (the older one where the newest's files are
// corrupt: what find_checkpoint() cannot know), and what it throws refuses the load on every
// device, changing nothing.
TEST_F(Checkpoint, AcceptJudgesTheCheckpointLoaded) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  const std::string where = dir("accept");
  save(config, where, 2, 1);
  save(config, where, 4, 2);
  fs::resize_file(fs::path(where) / "step-00000004" / "device-1.bin", 8);
  EXPECT_EQ(mt::find_checkpoint(where).step, 4);
  const auto before = snapshot(where);
  expect_all_threw(
      run(config,
          [&](Communicator& comm, const std::vector<int>& world) {
            Device dev(comm.rank(), config, model());
            const auto untouched = dev.params.all().front().value;
            mt::LoadOptions options;
            options.accept = [&](const std::string& path, const std::string& description) {
              EXPECT_EQ(description, R"({"run":"checkpoint_test"})");
              throw meshcast::ValidationError("checkpoint.model", path + " is another model's");
            };
            try {
              mt::load_checkpoint(comm, world, dev.params, where, options);
            } catch (...) {
              EXPECT_EQ(dev.params.all().front().value, untouched);
              throw;
            }
          }),
      "V ", "step-00000002 is another model's");
  EXPECT_EQ(snapshot(where), before);
}

TEST_F(Checkpoint, NoCheckpointLoadsNothing) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  fs::create_directory(dir("empty"));
  for (const std::string& where : {dir("empty"), dir("absent")})
    expect_ok(run(config, [&](Communicator& comm, const std::vector<int>& world) {
      Device dev(comm.rank(), config, model());
      const auto untouched = dev.params.all().front().value;
      EXPECT_EQ(mt::load_checkpoint(comm, world, dev.params, where), -1);
      EXPECT_EQ(dev.params.all().front().value, untouched);
    }));
  EXPECT_EQ(mt::find_checkpoint(dir("empty")).step, -1);
  EXPECT_EQ(mt::find_checkpoint(dir("absent")).step, -1);
  EXPECT_FALSE(fs::exists(dir("absent")));
}

TEST_F(Checkpoint, RefusesAnotherModel) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  const std::string where = dir("model");
  save(config, where, 1, 1);

  auto without = model();
  without.erase(without.begin() + 4);  // head.ln.g
  auto reshaped = model();
  reshaped[5].shape = {d, vocab + 1};  // head.w
  auto extra = model();
  extra.push_back({"extra.b", {d}, {Sp::Rows}, mt::Init::Zeros, false, 1, 7});
  const std::vector<std::pair<std::vector<Spec>, std::string>> cases = {
      {without, "parameter head.ln.g is not in the model"},
      {reshaped, "no parameter head.w of shape"},
      {extra, "no parameter extra.b"},
  };
  for (const auto& [specs, needle] : cases) {
    SCOPED_TRACE(needle);
    expect_all_threw(run(config,
                         [&](Communicator& comm, const std::vector<int>& world) {
                           Device dev(comm.rank(), config, specs);
                           mt::load_checkpoint(comm, world, dev.params, where);
                         }),
                     "V ", needle);
  }
}

TEST_F(Checkpoint, UnwritableDirectoryFailsOnEveryDevice) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  write_file(dir("file"), "not a directory");
  expect_all_threw(run(config,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), config, model());
                         mt::save_checkpoint(comm, world, dev.params, 1, dir("file") + "/ckpt", "");
                       }),
                   "I ", "file/ckpt");
}

TEST_F(Checkpoint, RefusesAnInvalidDescription) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  expect_all_threw(run(config,
                       [&](Communicator& comm, const std::vector<int>& world) {
                         Device dev(comm.rank(), config, model());
                         mt::save_checkpoint(comm, world, dev.params, 1, dir("desc"), "{oops");
                       }),
                   "V ", "checkpoint.description");
  EXPECT_FALSE(fs::exists(dir("desc")));
}

// A state no training leaves (here a NaN in one device's m, or a negative second moment) is
// refused on every device before anything is written: saved, a load would spread it into the
// weights.
TEST_F(Checkpoint, SavesNoStateThatTrainingCannotLeave) {
  const auto config = parallel({"dp=1,grid=2x1x1"});
  for (const bool nan : {true, false}) {
    const std::string path = dir(nan ? "nan" : "negative");
    expect_all_threw(run(config,
                         [&](Communicator& comm, const std::vector<int>& world) {
                           Device dev(comm.rank(), config, model());
                           mt::Param& p = dev.params.all().front();
                           if (comm.rank() == 1) {
                             if (nan)
                               p.m.back() = std::numeric_limits<float>::quiet_NaN();
                             else
                               p.v.front() = -0.5F;
                           }
                           mt::save_checkpoint(comm, world, dev.params, 1, path, "");
                         }),
                     "V ", nan ? ": m element " : ": v element 0 is -0.5");
    EXPECT_FALSE(fs::exists(fs::path(path) / "step-00000001"));
  }
  // v = +inf is sound (the square of a gradient element above 1.8e19; its update is 0): saved,
  // and loaded back.
  const std::string path = dir("infinite-v");
  expect_ok(run(config, [&](Communicator& comm, const std::vector<int>& world) {
    Device dev(comm.rank(), config, model());
    dev.params.all().front().v.front() = std::numeric_limits<float>::infinity();
    mt::save_checkpoint(comm, world, dev.params, 1, path, "");
    Device loaded(comm.rank(), config, model());
    EXPECT_EQ(mt::load_checkpoint(comm, world, loaded.params, path), 1);
    EXPECT_EQ(loaded.params.all().front().v.front(), std::numeric_limits<float>::infinity());
  }));
}

}  // namespace
