// Model manifests: NCCL M2N's model and system configs, and the explicit per-tensor form, read
// into the TensorMoves of a whole-model sync. The placement rules are documented in
// meshcast/manifest.h.
#include "meshcast/manifest.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "lib/support/json_text.h"
#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "meshcast/units.h"

namespace meshcast {
namespace {

using detail::JsonReader;

constexpr std::int64_t kMaxTotalBytes = std::int64_t{1} << 50;
// Device ids summed over all layouts' meshes: each costs the Mesh ~16 bytes (ids and index).
constexpr std::int64_t kMaxMeshEntries = std::int64_t{1} << 27;

// A tensor name inside a field: printable, and short enough for a one-line message.
std::string tensor_field(std::string_view name) {
  return "tensors." + detail::printable(name, detail::kNameWidth);
}

// ---------------------------------------------------------------------------------------------
// System config

struct SideField {
  const char* key;
  int ParallelConfig::*member;
};
constexpr std::array<SideField, 8> kSideFields{{{"num_gpus", &ParallelConfig::num_gpus},
                                                {"tp_size", &ParallelConfig::tp},
                                                {"pp_size", &ParallelConfig::pp},
                                                {"dp_size", &ParallelConfig::dp},
                                                {"ep_size", &ParallelConfig::ep},
                                                {"cp_size", &ParallelConfig::cp},
                                                {"fsdp_size", &ParallelConfig::fsdp},
                                                {"etp_size", &ParallelConfig::etp}}};

// Fills in etp's default and checks that the degrees describe num_gpus ranks.
void validate_side(ParallelConfig& c, const std::string& f) {
  const auto field = [&](const char* key) { return f + "." + key; };
  if (c.num_gpus < 1) throw ValidationError(field("num_gpus"), "must be >= 1");
  check_limit(field("num_gpus"), c.num_gpus, limits().devices, "DEVICES");
  for (const auto& s : kSideFields) {
    const int v = c.*s.member;
    if (s.member == &ParallelConfig::etp ? v < 0 : v < 1)
      throw ValidationError(field(s.key), "must be >= 1, got " + std::to_string(v));
    if (v > c.num_gpus)
      throw ValidationError(
          field(s.key), std::to_string(v) + " exceeds num_gpus = " + std::to_string(c.num_gpus));
  }
  // Each factor is <= num_gpus <= 2^20: the products below fit in int64.
  const std::int64_t n = c.num_gpus;
  const std::int64_t others = std::int64_t{c.tp} * c.cp * c.pp;
  // The degree to blame: the first of tp, cp, pp whose product with those before it does not
  // divide num_gpus, else dp (the others fit, dp does not).
  const char* blamed = n % c.tp                          ? "tp_size"
                       : n % (std::int64_t{c.tp} * c.cp) ? "cp_size"
                       : n % others                      ? "pp_size"
                                                         : "dp_size";
  if (others * c.dp != n)
    throw ValidationError(
        field(blamed),
        "tp_size x cp_size x dp_size x pp_size = " + std::to_string(others * c.dp) +
            " differs from num_gpus = " + std::to_string(n) +
            (n % others == 0 ? " (dp_size " + std::to_string(n / others) + " would fit)" : ""));
  if (c.etp == 0) c.etp = c.ep == 1 ? c.tp : 1;
  const std::int64_t stage = std::int64_t{c.tp} * c.cp * c.dp;
  const std::int64_t experts = std::int64_t{c.ep} * c.etp;
  if (stage % experts != 0)
    throw ValidationError(field(c.ep > 1 ? "ep_size" : "etp_size"),
                          "ep_size x etp_size = " + std::to_string(experts) +
                              " does not divide a pipeline stage's tp_size x cp_size x dp_size = " +
                              std::to_string(stage) + " ranks");
  if ((std::int64_t{c.cp} * c.dp) % c.fsdp != 0)
    throw ValidationError(field("fsdp_size"), std::to_string(c.fsdp) +
                                                  " does not divide cp_size x dp_size = " +
                                                  std::to_string(std::int64_t{c.cp} * c.dp) +
                                                  " (FSDP shards over the data-parallel ranks)");
  if ((stage / experts) % c.fsdp != 0)
    throw ValidationError(field("fsdp_size"), std::to_string(c.fsdp) +
                                                  " does not divide the expert data-parallel " +
                                                  "size " + std::to_string(stage / experts));
}

// A key of a system config that asks for a placement meshcast does not make (an interleaved
// pipeline, another spelling of a degree, colocated sides, Megatron's uneven or virtual pipeline
// stages: num_layers_per_virtual_pipeline_stage, decoder_first_pipeline_num_layers, ...):
// refused, where skipping it would place the tensors otherwise than asked. Sequence
// parallelism splits activations only.
void refuse_unsupported(std::string_view key, const std::string& f) {
  const auto has = [&](std::string_view word) { return key.find(word) != std::string_view::npos; };
  const bool placement = (has("parallel") && key != "sequence_parallel") ||
                         key.ends_with("p_size") || has("coloc") || has("pipeline") ||
                         has("virtual");
  if (placement)
    throw ValidationError(f + "." + std::string(key),
                          "not supported: meshcast places by num_gpus, tp_size, pp_size, dp_size, "
                          "cp_size, ep_size, etp_size and fsdp_size (trainers, then generators)");
}

ParallelConfig side_from(JsonReader& r, const std::string& f) {
  ParallelConfig c;
  c.etp = 0;
  bool has_gpus = false;
  r.object(f, [&](std::string_view key) {
    for (const auto& s : kSideFields)
      if (key == s.key) {
        const std::string field = f + "." + s.key;
        const auto v = r.integer<std::int64_t>(field);
        if (v < 0 || v > std::numeric_limits<int>::max())
          throw ValidationError(field, std::to_string(v) + " is out of range");
        if (v == 0)  // (etp's 0 means its default inside meshcast, not in a file)
          throw ValidationError(field, "must be >= 1, got 0");
        c.*s.member = static_cast<int>(v);
        has_gpus |= s.member == &ParallelConfig::num_gpus;
        return;
      }
    refuse_unsupported(key, f);
    r.skip();  // other keys (batch sizes, sequence lengths, ...) are not ours
  });
  if (!has_gpus) throw ValidationError(f + ".num_gpus", "missing");
  validate_side(c, f);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Dtypes

struct DTypeName {
  std::string_view name;
  DType storage;
};
// safetensors' names. The 8-bit floats have no meshcast dtype: they travel as i8, the type of
// their size, since moving copies bits and never converts. Summing them as i8 would be wrong, so
// they must not be partial (the model config's layouts never are).
constexpr std::array<DTypeName, 15> kDTypes{{{"F64", DType::f64},
                                             {"F32", DType::f32},
                                             {"F16", DType::f16},
                                             {"BF16", DType::bf16},
                                             {"I64", DType::i64},
                                             {"I32", DType::i32},
                                             {"I16", DType::i16},
                                             {"I8", DType::i8},
                                             {"U64", DType::u64},
                                             {"U32", DType::u32},
                                             {"U16", DType::u16},
                                             {"U8", DType::u8},
                                             {"BOOL", DType::b8},
                                             {"F8_E4M3", DType::i8},
                                             {"F8_E5M2", DType::i8}}};

DType storage_dtype(const std::string& name, const std::string& field) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.storage;
  for (DType t : kAllDTypes)
    if (name == to_string(t)) return t;
  throw ValidationError(field, "unknown dtype " + detail::quote(name) +
                                   " (expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 "
                                   "U16 U8 BOOL F8_E4M3 F8_E5M2, or f32 bf16 ...)");
}

// ---------------------------------------------------------------------------------------------
// The model file

struct Entry {
  std::string name;
  Shape shape;
  std::string dtype;
  std::optional<std::string> src, dst, dst_dtype;
  bool has_dtype = false, has_shape = false;
  std::string other;  // the first key of no meaning here (an explicit entry refuses it)
};

Entry entry_from(JsonReader& r, std::string name) {
  Entry e;
  e.name = std::move(name);
  const std::string f = tensor_field(e.name);
  r.object(f, [&](std::string_view key) {
    if (key == "shape") {
      e.has_shape = true;
      r.array(f + ".shape", [&](std::size_t) {
        if (e.shape.size() == 64) throw ValidationError(f + ".shape", "more than 64 dimensions");
        const auto n = r.integer<std::int64_t>(f + ".shape");
        if (n < 0) throw ValidationError(f + ".shape", "negative extent " + std::to_string(n));
        e.shape.push_back(n);
      });
    } else if (key == "dtype") {
      e.has_dtype = true;
      e.dtype = r.string(f + ".dtype");
    } else if (key == "src") {
      e.src = r.string(f + ".src");
    } else if (key == "dst") {
      e.dst = r.string(f + ".dst");
    } else if (key == "dst_dtype") {
      e.dst_dtype = r.string(f + ".dst_dtype");
    } else {
      if (e.other.empty()) e.other = key;  // (before skip(), which may reuse the key's text)
      r.skip();  // M2N's configs carry other keys; they do not concern placement
    }
  });
  // An explicit entry is written for meshcast: a misspelt "dst_dtype" would silently not cast.
  if ((e.src || e.dst) && !e.other.empty())
    throw ValidationError(f + "." + e.other,
                          "unknown key of an explicit entry (expected shape, dtype, src, dst, "
                          "dst_dtype)");
  if (!e.has_shape) throw ValidationError(f + ".shape", "missing");
  if (!e.has_dtype) throw ValidationError(f + ".dtype", "missing");
  // Named here, as the tensor's shape (a layout would name its own): no dtype is under a byte.
  if (std::find(e.shape.begin(), e.shape.end(), 0) == e.shape.end()) {
    double elements = 1;
    for (std::int64_t n : e.shape) elements *= static_cast<double>(n);
    if (elements > static_cast<double>(kMaxTotalBytes))
      throw ValidationError(f + ".shape", "more than 2^50 elements, the bytes a model may have");
  }
  return e;
}

// Counts bytes and mesh sizes as tensors are added, refusing a model past the bounds before
// it costs memory.
class Budget {
 public:
  void add(const Layout& l) {
    if (l.bytes() > kMaxTotalBytes - bytes_)  // bytes_ <= the bound: no overflow
      throw ValidationError(
          "model", "the tensors' total exceeds " + std::to_string(kMaxTotalBytes) + " bytes");
    bytes_ += l.bytes();
  }
  void add_mesh(std::int64_t devices) {
    mesh_ += devices;
    if (mesh_ > kMaxMeshEntries)
      throw ValidationError("model", "the layouts' meshes list more than " +
                                         std::to_string(kMaxMeshEntries) + " devices in all");
  }

 private:
  std::int64_t bytes_ = 0, mesh_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Megatron placement

enum class Kind { Column, Row, Replicated };

std::vector<std::string_view> split_name(std::string_view name) {
  std::vector<std::string_view> parts;
  std::size_t s = 0;
  while (true) {
    const auto dot = name.find('.', s);
    parts.push_back(name.substr(s, dot - s));
    if (dot == std::string_view::npos) return parts;
    s = dot + 1;
  }
}

// The index that `s`, after the word `after` in tensor `name`, spells: none where s is not all
// digits; more than 9 digits are refused, not taken for no index.
std::optional<int> index_after(std::string_view s, std::string_view after, std::string_view name) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  if (s.size() > 9)
    throw ValidationError(tensor_field(name), "index " + detail::quote(s) + " after '" +
                                                  std::string(after) + "' has more than 9 digits");
  int v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  return v;
}

template <std::size_t N>
bool one_of(std::string_view s, const std::array<std::string_view, N>& set) {
  return std::find(set.begin(), set.end(), s) != set.end();
}

constexpr std::array<std::string_view, 4> kLayerWords{"layers", "h", "layer", "blocks"};
// HF GPT-2's Conv1D modules store [in, out] (c_attn also fuses q, k and v), GPT-BigCode's of
// the same names [out, in]: the name does not say which dim tensor parallelism splits.
constexpr std::array<std::string_view, 3> kConv1D{"c_attn", "c_fc", "c_proj"};
constexpr std::array<std::string_view, 30> kColumn{"q_proj",
                                                   "k_proj",
                                                   "v_proj",
                                                   "qkv_proj",
                                                   "query_key_value",
                                                   "linear_qkv",
                                                   "wq",
                                                   "wk",
                                                   "wv",
                                                   "q_b_proj",
                                                   "kv_b_proj",
                                                   "gate_proj",
                                                   "up_proj",
                                                   "gate_up_proj",
                                                   "w1",
                                                   "w3",
                                                   "fc1",
                                                   "dense_h_to_4h",
                                                   "linear_fc1",
                                                   "embed_tokens",
                                                   "wte",
                                                   "word_embeddings",
                                                   "tok_embeddings",
                                                   "embed_in",
                                                   "lm_head",
                                                   "output_layer",
                                                   "embed_out",
                                                   "query",
                                                   "key",
                                                   "value"};
constexpr std::array<std::string_view, 10> kRow{
    "o_proj", "down_proj",     "dense",       "out_proj", "w2",
    "fc2",    "dense_4h_to_h", "linear_proj", "wo",       "linear_fc2"};
// Vocabulary embeddings and output heads (modules): a model with an embedding and no head ties
// the two (the embedding is also the head).
constexpr std::array<std::string_view, 5> kEmbedding{"embed_tokens", "wte", "word_embeddings",
                                                     "tok_embeddings", "embed_in"};
constexpr std::array<std::string_view, 4> kHead{"lm_head", "output_layer", "embed_out", "output"};
constexpr std::array<std::string_view, 5> kLastStage{"lm_head", "output_layer", "embed_out", "norm",
                                                     "ln_f"};
// The words after which an index numbers an expert: "experts.<i>." (HF), and Megatron-Core's
// "experts.local_experts.<i>." (SequentialMLP).
constexpr std::array<std::string_view, 2> kExpertWords{"experts", "local_experts"};

// What the name says: the layer (-1: none), the expert index (-1: none) and the name of the
// group it joins (the name without ".<i>" after "experts"), and the kind of split.
struct NameInfo {
  int layer = -1;
  int expert = -1;
  std::string group;
  Kind kind = Kind::Replicated;
  bool embedding = false;  // a vocabulary embedding (the head too where the model has none)
  bool head = false;       // an output head's weight or bias (on the last stage)
  // Right under "experts", with no index: every expert in one tensor, dim 0 indexing them
  // (GPT-OSS's and Llama 4's "experts.gate_up_proj" [experts, in, out]).
  bool fused_experts = false;
};

NameInfo name_info(std::string_view name, std::size_t ndim) {
  NameInfo info;
  auto parts = split_name(name);
  std::size_t expert_at = parts.size();
  bool in_experts = false;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    in_experts = in_experts || parts[i] == "experts";
    const bool layer = one_of(parts[i], kLayerWords), expert = one_of(parts[i], kExpertWords);
    if (!layer && !expert) continue;
    const std::optional<int> k = index_after(parts[i + 1], parts[i], name);
    if (k && layer && info.layer < 0) info.layer = *k;
    if (k && expert && info.expert < 0) {
      info.expert = *k;
      expert_at = i + 1;
    }
  }
  // Megatron-Core's grouped experts (TEGroupedMLP): "experts.linear_fc1.weight<i>", bias<i>.
  std::string_view param = parts.back();
  for (const std::string_view kind : {std::string_view("weight"), std::string_view("bias")}) {
    if (info.expert >= 0 || !in_experts || !param.starts_with(kind) || param.size() == kind.size())
      continue;
    if (const std::optional<int> k = index_after(param.substr(kind.size()), kind, name)) {
      info.expert = *k;
      param = parts.back() = kind;
    }
  }
  // (Only a parameter right under "experts", of 2 dims or more: SwitchTransformers' and NLLB's
  // "experts.expert_0.wi" are one expert each, JetMoE's "experts.bias" a vector.)
  info.fused_experts =
      info.expert < 0 && parts.size() >= 2 && parts[parts.size() - 2] == "experts" && ndim >= 2;
  if (info.expert >= 0)
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (i != expert_at) {
        if (!info.group.empty()) info.group += '.';
        info.group += parts[i];
      }
  // The module is the component before the parameter's own name (weight, bias).
  if (info.fused_experts || parts.size() < 2 || (param != "weight" && param != "bias")) return info;
  const std::string_view module = parts[parts.size() - 2];
  if (one_of(module, kConv1D))
    throw ValidationError(
        tensor_field(name),
        "'" + std::string(module) +
            "' is HF GPT-2's Conv1D, stored [in, out] (c_attn also fuses q, k and v), or "
            "GPT-BigCode's linear, stored [out, in]: the name does not say which dim tensor "
            "parallelism splits; give every tensor its src and dst layouts (the explicit form)");
  // A head: a module of a head's name, or one inside it (RoBERTa's lm_head.decoder); Meta's
  // "output" is one only as the module outside the layers (BERT's layers have "output"s).
  const bool head =
      std::any_of(parts.begin(), parts.end() - 1,
                  [](std::string_view p) { return p != "output" && one_of(p, kHead); }) ||
      (module == "output" && info.layer < 0);
  info.head = head;
  info.embedding = one_of(module, kEmbedding) && param == "weight";
  // Meta's head is column-parallel as the others; BERT's intermediate.dense is its up
  // projection, its other dense layers project back.
  const bool column =
      one_of(module, kColumn) || (module == "output" && head) ||
      (module == "dense" && parts.size() >= 3 && parts[parts.size() - 3] == "intermediate");
  if (column) info.kind = Kind::Column;  // a column layer's bias is split with its output rows
  // (A dense layer outside the layers, BERT's pooler.dense and cls.predictions.transform.dense,
  // is a plain linear in Megatron: replicated.)
  else if (one_of(module, kRow) && param == "weight" && ndim >= 2 &&
           !(module == "dense" && info.layer < 0))
    info.kind = Kind::Row;
  return info;
}

// A norm of the embedding (BLOOM's word_embeddings_layernorm) stays with it on the first stage;
// GPT-NeoX's embed_out is the output layer.
bool on_last_stage(const NameInfo& info, std::string_view name) {
  // BERT's pooler and its pretraining heads ("cls.") follow the encoder, as Megatron's
  // post-process does.
  if (info.head || name.starts_with("cls.") || name.find("pooler.") != std::string_view::npos)
    return true;
  if (name.find("embed") != std::string_view::npos &&
      name.find("embed_out") == std::string_view::npos)
    return false;
  return std::any_of(kLastStage.begin(), kLastStage.end(),
                     [&](std::string_view w) { return name.find(w) != std::string_view::npos; });
}

// One side of the system: builds the layout of a tensor of a stage.
class Side {
 public:
  Side(const ParallelConfig& c, std::string side, int base, int layers)
      : c_(c), side_(std::move(side)), base_(base), layers_(layers) {}

  int stage_of(const NameInfo& info, std::string_view name) const {
    if (info.layer >= 0) {
      // Stage s owns [floor(s L / pp), floor((s+1) L / pp)): the largest s with floor(sL/pp) <= l.
      return static_cast<int>((std::int64_t{info.layer + 1} * c_.pp - 1) / layers_);
    }
    return on_last_stage(info, name) ? c_.pp - 1 : 0;
  }

  int last_stage() const { return c_.pp - 1; }

  // `expert`: the tensor is a group of experts (dim 0 indexes them). `also`: a second stage
  // that holds a replica (a tied embedding's last stage), -1 for none.
  Layout layout(const Shape& shape, DType dtype, Kind kind, bool expert, int stage, int also,
                const std::string& field) const {
    const std::int64_t stage_size = std::int64_t{c_.tp} * c_.cp * c_.dp;
    const bool two = also >= 0 && also != stage;
    // Axes, slowest first, and the axes splitting each tensor dim.
    std::vector<std::int64_t> extents;
    std::vector<std::vector<int>> dims(shape.size());
    const auto add = [&](std::int64_t extent) {
      extents.push_back(extent);
      return static_cast<int>(extents.size() - 1);
    };
    add(two ? 2 : 1);  // the stages, replicas of each other
    if (!expert) {
      const std::int64_t replicas = std::int64_t{c_.cp} * c_.dp;
      add(replicas / c_.fsdp);
      const int fsdp = add(c_.fsdp);
      const int tp = add(c_.tp);
      if (kind == Kind::Column) dims[0].push_back(tp);
      if (kind == Kind::Row) dims[1].push_back(tp);
      dims[0].push_back(fsdp);
    } else {
      const std::int64_t edp = stage_size / (std::int64_t{c_.ep} * c_.etp);
      add(edp / c_.fsdp);
      const int fsdp = add(c_.fsdp);
      const int ep = add(c_.ep);
      const int etp = add(c_.etp);
      if (shape[0] % c_.ep != 0)  // Megatron asserts it; floor(k n / p) would leave ranks none
        throw ValidationError(field, std::to_string(shape[0]) + " experts do not divide over " +
                                         side_ + ".ep_size " + std::to_string(c_.ep));
      dims[0] = {ep, fsdp};
      if (kind == Kind::Column && shape.size() >= 2) dims[1].push_back(etp);
      if (kind == Kind::Row && shape.size() >= 3) dims[2].push_back(etp);
    }
    // Leave out the axes of extent 1 (they split nothing): "2@0-1:S0R", not "1x1x2@0-1:S2R".
    std::vector<int> renumber(extents.size(), -1);
    std::vector<std::int64_t> kept;
    for (std::size_t a = 0; a < extents.size(); ++a)
      if (extents[a] > 1) {
        renumber[a] = static_cast<int>(kept.size());
        kept.push_back(extents[a]);
      }
    if (kept.empty()) kept.push_back(1);
    for (auto& d : dims) {
      std::vector<int> axes;
      for (int a : d)
        if (renumber[static_cast<std::size_t>(a)] >= 0)
          axes.push_back(renumber[static_cast<std::size_t>(a)]);
      d = std::move(axes);
    }
    std::vector<int> devices;
    for (const int s : two ? std::vector<int>{stage, also} : std::vector<int>{stage})
      for (std::int64_t i = 0; i < stage_size; ++i)
        devices.push_back(base_ + static_cast<int>(s * stage_size + i));
    return Layout(shape, dtype, Mesh(std::move(kept), std::move(devices), field + ".mesh"),
                  ShardingSpec(std::move(dims)), field);
  }

 private:
  const ParallelConfig& c_;
  std::string side_;  // "system.train", "system.generation"
  int base_;
  int layers_;
};

// Whether two dtype names of a file are one type: "F32" and "f32" are; an 8-bit float is only
// itself (F8_E4M3 and F8_E5M2 are both stored as i8, and neither is i8).
bool same_dtype(const std::string& a, const std::string& b, DType as, DType bs) {
  const bool fa = a.starts_with("F8_"), fb = b.starts_with("F8_");
  return as == bs && fa == fb && (!fa || a == b);
}

std::optional<DType> dst_dtype_of(const Entry& e, DType src, std::optional<DType> cast,
                                  const std::string& f) {
  if (e.dst_dtype) {
    const DType t = storage_dtype(*e.dst_dtype, f + ".dst_dtype");
    if (!same_dtype(e.dtype, *e.dst_dtype, src, t) &&
        !(src == DType::f32 && (t == DType::bf16 || t == DType::f16)))
      throw ValidationError(f + ".dst_dtype", "a tensor of dtype " + e.dtype + " cannot become " +
                                                  *e.dst_dtype +
                                                  " (only f32 casts, to bf16 or f16)");
    return t;
  }
  if (cast && src == DType::f32) return cast;
  return std::nullopt;
}

ModelManifest read_explicit(std::vector<Entry>& entries, std::optional<DType> cast) {
  ModelManifest m;
  Budget budget;
  // Distinct ids (a set: ids may be large and sparse, "1@2000000000").
  std::unordered_set<int> src_seen, dst_seen;
  const auto mark = [](std::unordered_set<int>& seen, const Mesh& mesh) {
    seen.insert(mesh.devices().begin(), mesh.devices().end());
  };
  m.moves.reserve(entries.size());
  for (Entry& e : entries) {
    const std::string f = tensor_field(e.name);
    const DType t = storage_dtype(e.dtype, f + ".dtype");
    Layout src = Layout::parse(e.shape, t, *e.src, f + ".src");
    if (e.dtype.starts_with("F8_") && (src.partial_groups() > 1))
      throw ValidationError(f + ".src", "a pending sum of " + e.dtype +
                                            " cannot be summed (8-bit floats travel as raw bytes)");
    budget.add_mesh(src.mesh().size());
    const DType dt = dst_dtype_of(e, t, cast, f).value_or(t);
    Layout dst = Layout::parse(e.shape, dt, *e.dst, f + ".dst");
    budget.add_mesh(dst.mesh().size());
    budget.add(src);
    mark(src_seen, src.mesh());
    mark(dst_seen, dst.mesh());
    m.moves.push_back({std::move(e.name), std::move(src), std::move(dst)});
    m.dtype_names.push_back(std::move(e.dtype));
  }
  m.trainer_devices = static_cast<int>(src_seen.size());
  m.generator_devices = static_cast<int>(dst_seen.size());
  return m;
}

ModelManifest read_config(std::vector<Entry>& entries, const SystemConfig& system,
                          std::optional<DType> cast) {
  // Group the experts: tensors of one group in expert order, placed at the first one's index.
  struct Tensor {
    std::size_t entry;  // the first (or only) entry
    NameInfo info;
    std::vector<std::pair<int, std::size_t>> experts;  // (expert index, entry), as read
  };
  std::vector<Tensor> tensors;
  std::unordered_map<std::string, std::size_t> by_name;  // output name -> index in tensors
  for (Entry& e : entries)
    if (e.shape.empty()) e.shape = {1};  // a scalar, placed as its one element (dims to split)
  int layers = 0;
  bool heads = false, embeddings = false;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    NameInfo info = name_info(e.name, e.shape.size());
    layers = std::max(layers, info.layer + 1);
    heads = heads || info.head;
    embeddings = embeddings || info.embedding;
    const int k = info.expert;
    const std::string key = k >= 0 ? info.group : e.name;
    const auto [it, fresh] = by_name.emplace(key, tensors.size());
    if (fresh)
      tensors.push_back({i, std::move(info), {}});
    else if (k < 0 || tensors[it->second].experts.empty())
      throw ValidationError(tensor_field(e.name), "the name " + detail::quote(key) +
                                                      " is both a tensor's and a group of "
                                                      "experts'");
    if (k >= 0) tensors[it->second].experts.emplace_back(k, i);
  }
  const int T = system.train.num_gpus, G = system.generation.num_gpus;
  if (std::int64_t{T} + G > limits().devices)
    throw ValidationError(
        "system", "train and generation together have " + std::to_string(std::int64_t{T} + G) +
                      " devices, more than the limit of " + std::to_string(limits().devices) +
                      " (MESHCAST_MAX_DEVICES)");
  const Side train(system.train, "system.train", 0, std::max(layers, 1));
  const Side gen(system.generation, "system.generation", T, std::max(layers, 1));
  // A tied embedding is also the head: the generator's last stage holds it too (the trainer's
  // first stage always holds it, and sends it). A tensor of no layer shaped as an embedding is
  // a head under another name (BERT's cls.predictions.decoder).
  std::set<Shape> embedding_shapes;
  for (const Tensor& t : tensors)
    if (t.info.embedding) embedding_shapes.insert(entries[t.entry].shape);
  for (const Tensor& t : tensors)
    heads = heads || (!t.info.embedding && t.info.layer < 0 && t.experts.empty() &&
                      embedding_shapes.count(entries[t.entry].shape) > 0);
  const bool tied = embeddings && !heads;

  ModelManifest m;
  m.trainer_devices = T;
  m.generator_devices = G;
  Budget budget;
  for (Tensor& t : tensors) {
    const Entry& first = entries[t.entry];
    const bool grouped = !t.experts.empty();  // experts of their own entries, grouped here
    const bool expert = grouped || t.info.fused_experts;
    if (t.info.fused_experts)
      for (const auto& [c, side] : {std::pair{&system.train, "system.train"},
                                    std::pair{&system.generation, "system.generation"}})
        if (c->etp > 1)
          throw ValidationError(
              tensor_field(first.name),
              "holds every expert in one tensor (dim 0), and its name does not say which other "
              "dim is the projection's output, so " +
                  std::string(side) + ".etp_size " + std::to_string(c->etp) +
                  " cannot split it: set etp_size 1, or give every tensor its src and dst "
                  "layouts (the explicit form)");
    std::string name = grouped ? t.info.group : first.name;
    const std::string f = tensor_field(name);
    Shape shape = first.shape;
    if (grouped) {
      // Experts 0..N-1, each once: sorted, the k-th is expert k.
      auto& ex = t.experts;
      std::sort(ex.begin(), ex.end());
      for (std::size_t k = 0; k < ex.size(); ++k) {
        if (k > 0 && ex[k].first == ex[k - 1].first)
          throw ValidationError(tensor_field(entries[ex[k].second].name),
                                "expert " + std::to_string(ex[k].first) + " is also " +
                                    detail::quote(entries[ex[k - 1].second].name));
        if (ex[k].first != static_cast<int>(k))
          throw ValidationError(f, "expert " + std::to_string(k) + " of " +
                                       std::to_string(ex.back().first + 1) + " is missing");
        const Entry& e = entries[ex[k].second];
        const Entry& e0 = entries[ex[0].second];
        if (e.shape != e0.shape)
          throw ValidationError(
              tensor_field(e.name) + ".shape",
              "[" + shape_str(e.shape) + "] differs from expert 0's [" + shape_str(e0.shape) + "]");
        if (!same_dtype(e.dtype, e0.dtype, storage_dtype(e.dtype, tensor_field(e.name) + ".dtype"),
                        storage_dtype(e0.dtype, tensor_field(e0.name) + ".dtype")))
          throw ValidationError(
              tensor_field(e.name) + ".dtype",
              detail::quote(e.dtype) + " differs from expert 0's " + detail::quote(e0.dtype));
      }
      shape.insert(shape.begin(), static_cast<std::int64_t>(t.experts.size()));
    }
    const Entry& e = grouped ? entries[t.experts[0].second] : first;
    const DType dtype = storage_dtype(e.dtype, tensor_field(e.name) + ".dtype");
    const DType dst_dtype = dst_dtype_of(e, dtype, cast, f).value_or(dtype);
    Layout src = train.layout(shape, dtype, t.info.kind, expert, train.stage_of(t.info, name), -1,
                              f + ".src");
    Layout dst = gen.layout(shape, dst_dtype, t.info.kind, expert, gen.stage_of(t.info, name),
                            tied && t.info.embedding ? gen.last_stage() : -1, f + ".dst");
    budget.add(src);
    budget.add_mesh(src.mesh().size() + dst.mesh().size());
    m.moves.push_back({std::move(name), std::move(src), std::move(dst)});
    m.dtype_names.push_back(e.dtype);
  }
  return m;
}

}  // namespace

std::int64_t ModelManifest::bytes() const {
  std::int64_t total = 0;
  for (const auto& t : moves) total += t.src.bytes();
  return total;
}

SystemConfig parse_system_config(std::string_view json) {
  JsonReader r(json, "system");
  r.check();
  SystemConfig s;
  bool has_train = false, has_generation = false;
  r.object("system", [&](std::string_view key) {
    if (key == "train") {
      s.train = side_from(r, "system.train");
      has_train = true;
    } else if (key == "generation") {
      s.generation = side_from(r, "system.generation");
      has_generation = true;
    } else {
      refuse_unsupported(key, "system");
      r.skip();
    }
  });
  if (!has_train) throw ValidationError("system.train", "missing");
  if (!has_generation) throw ValidationError("system.generation", "missing");
  return s;
}

ModelManifest read_model(std::string_view model_json, const SystemConfig* system,
                         std::optional<DType> cast) {
  if (cast && *cast != DType::bf16 && *cast != DType::f16)
    throw ValidationError("cast",
                          "f32 tensors may be cast to bf16 or f16, not " + to_string(*cast));
  JsonReader r(model_json, "model");
  r.check();  // syntax and keys given twice, before anything else is reported
  std::vector<Entry> entries;
  // kTensorPlanBytes a tensor, counted against the planning memory as the tensors are read, so
  // that a model of many tensors is refused within that bound.
  const std::int64_t most = limits().plan_memory_bytes / kTensorPlanBytes;
  r.object("model", [&](std::string_view name) {
    const auto n = static_cast<std::int64_t>(entries.size());
    if (n == kMaxManifestTensors)
      throw ValidationError("model",
                            "more than " + std::to_string(kMaxManifestTensors) + " tensors");
    if (n == most)
      throw ValidationError("plan memory", "tensor " + std::to_string(n + 1) +
                                               " of the model would exceed the limit of " +
                                               human_bytes(limits().plan_memory_bytes) +
                                               ": a tensor takes about " +
                                               human_bytes(kTensorPlanBytes) +
                                               " to read and plan (raise it with "
                                               "MESHCAST_MAX_PLAN_MEMORY_BYTES)");
    if (name.empty()) throw ValidationError("tensors.", "a tensor has an empty name");
    if (name.size() > kMaxTensorNameBytes)
      throw ValidationError(tensor_field(name),
                            "a name of " + std::to_string(name.size()) + " bytes, over the " +
                                std::to_string(kMaxTensorNameBytes) + " a name may have");
    entries.push_back(entry_from(r, std::string(name)));
  });
  if (entries.empty()) throw ValidationError("model", "no tensors");

  // One form per file: the first entry decides, the first that differs is named.
  const auto is_explicit = [](const Entry& e) { return e.src || e.dst; };
  const bool explicit_form = is_explicit(entries.front());
  for (const Entry& e : entries) {
    if (is_explicit(e) != explicit_form)
      throw ValidationError(
          tensor_field(e.name),
          explicit_form ? "has no src/dst layouts but " + detail::quote(entries.front().name) +
                              " has: give layouts for every tensor or for none"
                        : "has src/dst layouts but " + detail::quote(entries.front().name) +
                              " has none: give layouts for every tensor or for none");
    if (explicit_form && !e.src) throw ValidationError(tensor_field(e.name) + ".src", "missing");
    if (explicit_form && !e.dst) throw ValidationError(tensor_field(e.name) + ".dst", "missing");
    if (!explicit_form && e.dst_dtype)
      throw ValidationError(tensor_field(e.name) + ".dst_dtype",
                            "only with per-tensor src/dst layouts (use the cast option)");
  }
  if (explicit_form) {
    if (system)
      throw ValidationError("system",
                            "the model gives per-tensor layouts: a system config does not apply");
    return read_explicit(entries, cast);
  }
  if (!system)
    throw ValidationError("system", "required for a model config without per-tensor layouts");
  return read_config(entries, *system, cast);
}

SystemConfig load_system_config(const std::string& path) {
  return parse_system_config(read_input_file(path, "system", limits().input_file_bytes));
}

ModelManifest load_model(const std::string& path, const SystemConfig* system,
                         std::optional<DType> cast) {
  return read_model(read_input_file(path, "model", limits().input_file_bytes), system, cast);
}

}  // namespace meshcast
