// Model manifests: the Megatron placement of each kind of tensor (tiles of a few devices),
// uneven shards, expert grouping, pipeline stages, FSDP, casts, the explicit form, every error
// with the field it names, and every shipped manifest with its system config (tensor counts and
// bytes computed here from the files, independently of the reader).
#include "meshcast/manifest.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "meshcast/error.h"
#include "meshcast/topology.h"

namespace meshcast {
namespace {

// The field of the error of type E that f() throws ("<none>" if it throws nothing).
template <class E, class F>
std::string field_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.field();
  }
  return "<none>";
}

template <class E, class F>
std::string cause_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.cause();
  }
  return "<none>";
}

SystemConfig system_of(const std::string& json) { return parse_system_config(json); }

const TensorMove& move(const ModelManifest& m, const std::string& name) {
  for (const auto& t : m.moves)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

std::string range(const Layout& l, int device, std::size_t dim) {
  const Box b = l.tile_of(device);
  return std::to_string(b[dim].lo) + ":" + std::to_string(b[dim].hi);
}

// A 4-layer Llama with biases on q/k/v and o, untied head; [out, in] weights.
const char* kLlama = R"({
  "model.embed_tokens.weight": {"shape": [10, 4], "dtype": "BF16"},
  "model.layers.0.input_layernorm.weight": {"shape": [4], "dtype": "BF16"},
  "model.layers.0.self_attn.q_proj.weight": {"shape": [8, 4], "dtype": "BF16"},
  "model.layers.0.self_attn.q_proj.bias": {"shape": [8], "dtype": "BF16"},
  "model.layers.0.self_attn.o_proj.weight": {"shape": [4, 8], "dtype": "BF16"},
  "model.layers.0.self_attn.o_proj.bias": {"shape": [4], "dtype": "BF16"},
  "model.layers.1.mlp.gate_proj.weight": {"shape": [6, 4], "dtype": "BF16", "other": [1]},
  "model.layers.2.mlp.up_proj.weight": {"shape": [6, 4], "dtype": "F32"},
  "model.layers.3.mlp.down_proj.weight": {"shape": [4, 6], "dtype": "F8_E4M3"},
  "model.norm.weight": {"shape": [4], "dtype": "BF16"},
  "lm_head.weight": {"shape": [10, 4], "dtype": "BF16"}
})";

const char* kTp2Pp2ToTp2Dp2 = R"({
  "train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2, "micro_batch_size": 4},
  "generation": {"num_gpus": 4, "tp_size": 2, "dp_size": 2}
})";

TEST(ManifestSystem, DefaultsAndUnknownKeys) {
  const auto s = system_of(R"({"train": {"num_gpus": 8, "tp_size": 2, "dp_size": 4},
                               "generation": {"num_gpus": 2, "ep_size": 2, "dp_size": 2},
                               "notes": "ignored"})");
  EXPECT_EQ(s.train.num_gpus, 8);
  EXPECT_EQ(s.train.tp, 2);
  EXPECT_EQ(s.train.pp, 1);
  EXPECT_EQ(s.train.cp, 1);
  EXPECT_EQ(s.train.fsdp, 1);
  EXPECT_EQ(s.train.etp, 2);  // ep 1: experts split like the dense MLP, over tp
  EXPECT_EQ(s.generation.ep, 2);
  EXPECT_EQ(s.generation.etp, 1);  // ep > 1: whole experts
}

TEST(ManifestSystem, ErrorsNameTheField) {
  const auto f = [](const std::string& json) {
    return field_of<Error>([&] { parse_system_config(json); });
  };
  const std::string gen = R"("generation": {"num_gpus": 1})";
  EXPECT_EQ(f(R"({"train": {"num_gpus": 4, "tp_size": 2}, )" + gen + "}"), "system.train.dp_size");
  EXPECT_NE(cause_of<ValidationError>([&] {
              parse_system_config(R"({"train": {"num_gpus": 4, "tp_size": 2}, )" + gen + "}");
            }).find("dp_size 2 would fit"),
            std::string::npos);
  // The degree that does not divide the GPU count is named, not the dp_size left over.
  EXPECT_EQ(f(R"({"train": {"num_gpus": 4, "tp_size": 3}, )" + gen + "}"), "system.train.tp_size");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 4, "tp_size": 2, "cp_size": 3}, )" + gen + "}"),
            "system.train.cp_size");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 6, "tp_size": 2, "pp_size": 2}, )" + gen + "}"),
            "system.train.pp_size");
  // A placement meshcast does not make is refused, not skipped; other keys are skipped.
  for (const char* key : {"vpp_size", "virtual_pipeline_model_parallel_size",
                          "expert_tensor_parallel_size", "enable_expert_parallel"})
    EXPECT_EQ(f(std::string(R"({"train": {"num_gpus": 1, ")") + key + R"(": 2}, )" + gen + "}"),
              std::string("system.train.") + key);
  EXPECT_EQ(f(R"({"colocate": true, "train": {"num_gpus": 1}, )" + gen + "}"), "system.colocate");
  EXPECT_NO_THROW(parse_system_config(
      R"({"train": {"num_gpus": 1, "sequence_parallel": true, "micro_batch_size": 4}, )" + gen +
      "}"));
  // EP carved out of a stage's 4 ranks: 3 does not divide them.
  EXPECT_EQ(f(R"({"train": {"num_gpus": 4, "dp_size": 4, "ep_size": 3}, )" + gen + "}"),
            "system.train.ep_size");
  EXPECT_EQ(
      f(R"({"train": {"num_gpus": 4, "tp_size": 2, "dp_size": 2, "etp_size": 3}, )" + gen + "}"),
      "system.train.etp_size");
  // 0 is no degree, etp's neither (its default is asked for by leaving it out).
  EXPECT_EQ(f(R"({"train": {"num_gpus": 4, "dp_size": 4, "etp_size": 0}, )" + gen + "}"),
            "system.train.etp_size");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 6, "dp_size": 6, "fsdp_size": 4}, )" + gen + "}"),
            "system.train.fsdp_size");
  EXPECT_EQ(f(R"({"train": {"tp_size": 1}, )" + gen + "}"), "system.train.num_gpus");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 0}, )" + gen + "}"), "system.train.num_gpus");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 2, "dp_size": 2, "pp_size": -1}, )" + gen + "}"),
            "system.train.pp_size");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 2, "tp_size": 2.5}, )" + gen + "}"),
            "system.train.tp_size");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 1}})"), "system.generation");
  EXPECT_EQ(f(R"({"generation": {"num_gpus": 1}})"), "system.train");
  EXPECT_EQ(f(R"({"train": {"num_gpus": 1, "num_gpus": 1}, )" + gen + "}"), "system");
  EXPECT_EQ(f(R"([1])"), "system");
  EXPECT_EQ(f(R"({"train": )"), "system");
}

TEST(ManifestPlacement, MegatronKindsAndStages) {
  const auto sys = system_of(kTp2Pp2ToTp2Dp2);
  const auto m = read_model(kLlama, &sys);
  ASSERT_EQ(m.moves.size(), 11u);
  EXPECT_EQ(m.trainer_devices, 4);
  EXPECT_EQ(m.generator_devices, 4);
  // Trainer: stage 0 = ranks 0-1 (layers 0, 1 and the embedding), stage 1 = ranks 2-3 (layers
  // 2, 3, the final norm and the head). Generator: 2 replicas (dp) x tp 2 on ranks 4-7.
  const std::map<std::string, std::pair<std::string, std::string>> want{
      {"model.embed_tokens.weight", {"2@0-1:S0R", "2x2@4-7:S1R"}},
      {"model.layers.0.input_layernorm.weight", {"2@0-1:R", "2x2@4-7:R"}},
      {"model.layers.0.self_attn.q_proj.weight", {"2@0-1:S0R", "2x2@4-7:S1R"}},
      {"model.layers.0.self_attn.q_proj.bias", {"2@0-1:S0", "2x2@4-7:S1"}},
      {"model.layers.0.self_attn.o_proj.weight", {"2@0-1:RS0", "2x2@4-7:RS1"}},
      {"model.layers.0.self_attn.o_proj.bias", {"2@0-1:R", "2x2@4-7:R"}},
      {"model.layers.1.mlp.gate_proj.weight", {"2@0-1:S0R", "2x2@4-7:S1R"}},
      {"model.layers.2.mlp.up_proj.weight", {"2@2-3:S0R", "2x2@4-7:S1R"}},
      {"model.layers.3.mlp.down_proj.weight", {"2@2-3:RS0", "2x2@4-7:RS1"}},
      {"model.norm.weight", {"2@2-3:R", "2x2@4-7:R"}},
      {"lm_head.weight", {"2@2-3:S0R", "2x2@4-7:S1R"}},
  };
  for (const auto& t : m.moves) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(want.count(t.name));
    EXPECT_EQ(t.src.str(), want.at(t.name).first);
    EXPECT_EQ(t.dst.str(), want.at(t.name).second);
    EXPECT_EQ(t.src.shape(), t.dst.shape());
  }
  // Tiles: tp rank 1 holds the second half of q's rows, of o's columns.
  const auto& q = move(m, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(range(q.src, 1, 0), "4:8");
  EXPECT_EQ(range(q.src, 1, 1), "0:4");
  EXPECT_EQ(range(q.dst, 5, 0), "4:8");
  EXPECT_EQ(range(q.dst, 6, 0), "0:4");  // the second replica's tp rank 0
  const auto& o = move(m, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(range(o.src, 0, 1), "0:4");
  EXPECT_EQ(range(o.dst, 7, 1), "4:8");
  EXPECT_EQ(range(o.dst, 7, 0), "0:4");
  // dtypes: storage and the file's name.
  const auto& down = move(m, "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(down.src.dtype(), DType::i8);
  EXPECT_EQ(m.dtype_names[8], "F8_E4M3");
  EXPECT_EQ(m.dtype_names[7], "F32");
  EXPECT_EQ(m.bytes(), 2 * (10 * 4 + 4 + 32 + 8 + 32 + 4 + 24 + 4 + 40) + 4 * 24 + 24);
}

// An embedding's norm stays with the embedding on the first stage (BLOOM); GPT-NeoX's embed_out
// is the head, on the last; an index of more than 9 digits is refused, not taken for no layer.
TEST(ManifestPlacement, EmbeddingNormsAndHugeIndices) {
  const auto sys = system_of(R"({"train": {"num_gpus": 2, "pp_size": 2},
                                 "generation": {"num_gpus": 1}})");
  const auto m =
      read_model(R"({"transformer.word_embeddings.weight": {"shape": [8, 4], "dtype": "F32"},
      "transformer.word_embeddings_layernorm.weight": {"shape": [4], "dtype": "F32"},
      "transformer.h.0.mlp.dense_4h_to_h.weight": {"shape": [4, 4], "dtype": "F32"},
      "transformer.h.1.mlp.dense_4h_to_h.weight": {"shape": [4, 4], "dtype": "F32"},
      "transformer.ln_f.weight": {"shape": [4], "dtype": "F32"},
      "embed_out.weight": {"shape": [8, 4], "dtype": "F32"}})",
                 &sys);
  EXPECT_EQ(move(m, "transformer.word_embeddings_layernorm.weight").src.str(), "1@0:R");
  EXPECT_EQ(move(m, "transformer.ln_f.weight").src.str(), "1@1:R");
  EXPECT_EQ(move(m, "embed_out.weight").src.str(), "1@1:RR");
  EXPECT_EQ(field_of<ValidationError>([&] {
              read_model(R"({"model.layers.12345678901.mlp.up_proj.weight": {"shape": [4, 4],
                             "dtype": "F32"}})",
                         &sys);
            }),
            "tensors.model.layers.12345678901.mlp.up_proj.weight");
}

// Meta's names (output is the head), BERT's dense layers (intermediate.dense projects up), and
// the Conv1D names whose orientation differs between models (refused).
TEST(ManifestPlacement, MetaHeadsBertDenseAndConv1D) {
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2},
                                 "generation": {"num_gpus": 2, "tp_size": 2}})");
  const auto meta = read_model(R"({"tok_embeddings.weight": {"shape": [10, 4], "dtype": "BF16"},
      "layers.0.attention.wq.weight": {"shape": [8, 4], "dtype": "BF16"},
      "layers.1.attention.wo.weight": {"shape": [4, 8], "dtype": "BF16"},
      "norm.weight": {"shape": [4], "dtype": "BF16"},
      "output.weight": {"shape": [10, 4], "dtype": "BF16"}})",
                               &sys);
  EXPECT_EQ(move(meta, "output.weight").src.str(), "2@2-3:S0R");
  EXPECT_EQ(move(meta, "tok_embeddings.weight").src.str(), "2@0-1:S0R");
  EXPECT_EQ(move(meta, "tok_embeddings.weight").dst.str(), "2@4-5:S0R");  // untied
  const auto bert =
      read_model(R"({"bert.encoder.layer.0.intermediate.dense.weight": {"shape": [8, 4],
      "dtype": "F32"}, "bert.encoder.layer.0.intermediate.dense.bias": {"shape": [8],
      "dtype": "F32"}, "bert.encoder.layer.0.output.dense.weight": {"shape": [4, 8],
      "dtype": "F32"}, "bert.encoder.layer.0.attention.output.dense.weight": {"shape": [4, 4],
      "dtype": "F32"}, "bert.encoder.layer.0.attention.self.query.weight": {"shape": [4, 4],
      "dtype": "F32"}, "bert.pooler.dense.weight": {"shape": [4, 4], "dtype": "F32"},
      "cls.predictions.transform.dense.weight": {"shape": [4, 4], "dtype": "F32"}})",
                 &sys);  // one layer: the last stage's
  EXPECT_EQ(bert.moves[0].src.str(), "2@2-3:S0R");
  EXPECT_EQ(bert.moves[1].src.str(), "2@2-3:S0");
  EXPECT_EQ(bert.moves[2].src.str(), "2@2-3:RS0");
  EXPECT_EQ(bert.moves[3].src.str(), "2@2-3:RS0");
  EXPECT_EQ(bert.moves[4].src.str(), "2@2-3:S0R");
  // Outside the layers, Megatron's BERT pooler and head transform are plain linears, on the
  // last stage.
  EXPECT_EQ(bert.moves[5].src.str(), "2@2-3:RR");
  EXPECT_EQ(bert.moves[6].src.str(), "2@2-3:RR");
  for (const char* module : {"attn.c_attn", "mlp.c_fc", "mlp.c_proj"}) {
    const std::string name = std::string("transformer.h.0.") + module + ".weight";
    SCOPED_TRACE(name);
    EXPECT_EQ(field_of<ValidationError>([&] {
                read_model("{\"" + name + R"(": {"shape": [4, 4], "dtype": "F32"}})", &sys);
              }),
              "tensors." + name);
  }
}

TEST(ManifestPlacement, CastAppliesToF32Only) {
  const auto sys = system_of(kTp2Pp2ToTp2Dp2);
  const auto m = read_model(kLlama, &sys, DType::bf16);
  for (std::size_t i = 0; i < m.moves.size(); ++i) {
    const auto& t = m.moves[i];
    EXPECT_EQ(t.dst.dtype(), t.src.dtype() == DType::f32 ? DType::bf16 : t.src.dtype()) << t.name;
  }
  EXPECT_EQ(move(m, "model.layers.2.mlp.up_proj.weight").dst.dtype(), DType::bf16);
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(kLlama, &sys, DType::i32); }), "cast");
}

TEST(ManifestPlacement, UnevenVocabulary) {
  // GPT-2's 50,257 rows over tp 4, and Qwen's 151,936 over tp 3: floor(k n / p) boundaries.
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "tp_size": 4},
                                 "generation": {"num_gpus": 3, "tp_size": 3}})");
  const auto m = read_model(R"({"transformer.wte.weight": {"shape": [50257, 8], "dtype": "F32"},
      "lm_head.weight": {"shape": [151936, 8], "dtype": "BF16"}})",
                            &sys);
  const auto& wte = m.moves[0];
  EXPECT_EQ(wte.src.str(), "4@0-3:S0R");
  EXPECT_EQ(range(wte.src, 0, 0), "0:12564");
  EXPECT_EQ(range(wte.src, 1, 0), "12564:25128");
  EXPECT_EQ(range(wte.src, 2, 0), "25128:37692");
  EXPECT_EQ(range(wte.src, 3, 0), "37692:50257");
  EXPECT_EQ(range(wte.dst, 6, 0), "33504:50257");
  const auto& head = m.moves[1];
  EXPECT_EQ(range(head.dst, 4, 0), "0:50645");
  EXPECT_EQ(range(head.dst, 5, 0), "50645:101290");
  EXPECT_EQ(range(head.dst, 6, 0), "101290:151936");
}

// Mixtral names: experts.N.w1 (column), w2 (row), the router block_sparse_moe.gate.
std::string mixtral(int experts, const std::string& extra = "") {
  std::ostringstream os;
  os << "{\"model.layers.0.block_sparse_moe.gate.weight\": {\"shape\": [" << experts
     << ", 4], \"dtype\": \"BF16\"}";
  for (int e = 0; e < experts; ++e) {
    const std::string p = "model.layers.0.block_sparse_moe.experts.";
    os << ",\n\"" << p << e << ".w1.weight\": {\"shape\": [6, 4], \"dtype\": \"BF16\"}";
    os << ",\n\"" << p << e << ".w2.weight\": {\"shape\": [4, 6], \"dtype\": \"BF16\"}";
  }
  os << ",\n\"model.layers.0.mlp.gate_proj.weight\": {\"shape\": [6, 4], \"dtype\": \"BF16\"}";
  os << extra << "}";
  return os.str();
}

TEST(ManifestExperts, GroupedPerLayerAndKind) {
  // Train: one stage of 4 ranks, tp 2 x dp 2, ep 4 (etp 1). Generation: tp 2, no ep (etp 2).
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "tp_size": 2, "dp_size": 2, "ep_size": 4},
                                 "generation": {"num_gpus": 2, "tp_size": 2}})");
  const auto m = read_model(mixtral(4), &sys);
  ASSERT_EQ(m.moves.size(), 4u);
  EXPECT_EQ(m.moves[0].name, "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(m.moves[1].name, "model.layers.0.block_sparse_moe.experts.w1.weight");
  EXPECT_EQ(m.moves[2].name, "model.layers.0.block_sparse_moe.experts.w2.weight");
  EXPECT_EQ(m.moves[3].name, "model.layers.0.mlp.gate_proj.weight");
  // The router is replicated (not a gate_proj); gate_proj is column-parallel.
  EXPECT_EQ(m.moves[0].src.str(), "2x2@0-3:RR");
  EXPECT_EQ(m.moves[0].dst.str(), "2@4-5:RR");
  EXPECT_EQ(m.moves[3].src.str(), "2x2@0-3:S1R");
  const auto& w1 = m.moves[1];
  const auto& w2 = m.moves[2];
  EXPECT_EQ(w1.src.shape(), (Shape{4, 6, 4}));
  EXPECT_EQ(w2.src.shape(), (Shape{4, 4, 6}));
  EXPECT_EQ(w1.src.str(), "4@0-3:S0RR");  // one expert per rank
  EXPECT_EQ(range(w1.src, 2, 0), "2:3");
  EXPECT_EQ(w1.dst.str(), "2@4-5:RS0R");  // every expert, half its intermediate rows
  EXPECT_EQ(w2.dst.str(), "2@4-5:RRS0");  // and half its intermediate columns
  EXPECT_EQ(range(w2.dst, 5, 2), "3:6");
  EXPECT_EQ(m.bytes(), 2 * (16 + 4 * 48 + 24));
  // Eight experts over ep 4 with etp 1: two per rank.
  const auto m8 = read_model(mixtral(8), &sys);
  EXPECT_EQ(range(m8.moves[1].src, 3, 0), "6:8");
}

// Megatron-Core's names: SequentialMLP's experts.local_experts.<i>.linear_fc1 and
// TEGroupedMLP's experts.linear_fc1.weight<i>, grouped like HF's experts.<i>.
TEST(ManifestExperts, MegatronCoreNames) {
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "dp_size": 4, "ep_size": 4},
                                 "generation": {"num_gpus": 2, "tp_size": 2}})");
  std::ostringstream os;
  os << "{\"decoder.layers.0.mlp.router.weight\": {\"shape\": [4, 16], \"dtype\": \"BF16\"}";
  for (int e = 0; e < 4; ++e) {
    const std::string p = "decoder.layers.0.mlp.experts.local_experts.";
    os << ",\"" << p << e << ".linear_fc1.weight\": {\"shape\": [8, 16], \"dtype\": \"BF16\"}";
    os << ",\"" << p << e << ".linear_fc2.weight\": {\"shape\": [16, 8], \"dtype\": \"BF16\"}";
    os << ",\"decoder.layers.1.mlp.experts.linear_fc1.weight" << e
       << "\": {\"shape\": [8, 16], \"dtype\": \"BF16\"}";
    os << ",\"decoder.layers.1.mlp.experts.linear_fc1.bias" << e
       << "\": {\"shape\": [8], \"dtype\": \"BF16\"}";
  }
  os << "}";
  const auto m = read_model(os.str(), &sys);
  ASSERT_EQ(m.moves.size(), 5u);
  const auto& fc1 = move(m, "decoder.layers.0.mlp.experts.local_experts.linear_fc1.weight");
  EXPECT_EQ(fc1.src.shape(), (Shape{4, 8, 16}));
  EXPECT_EQ(fc1.src.str(), "4@0-3:S0RR");  // one expert per rank
  EXPECT_EQ(range(fc1.src, 2, 0), "2:3");
  EXPECT_EQ(fc1.dst.str(), "2@4-5:RS0R");
  EXPECT_EQ(move(m, "decoder.layers.0.mlp.experts.local_experts.linear_fc2.weight").dst.str(),
            "2@4-5:RRS0");
  const auto& grouped = move(m, "decoder.layers.1.mlp.experts.linear_fc1.weight");
  EXPECT_EQ(grouped.src.shape(), (Shape{4, 8, 16}));
  EXPECT_EQ(grouped.src.str(), "4@0-3:S0RR");
  const auto& bias = move(m, "decoder.layers.1.mlp.experts.linear_fc1.bias");
  EXPECT_EQ(bias.src.shape(), (Shape{4, 8}));
  EXPECT_EQ(bias.src.str(), "4@0-3:S0R");
  EXPECT_EQ(bias.dst.str(), "2@4-5:RS0");  // a column layer's bias, split with its rows
  EXPECT_EQ(move(m, "decoder.layers.0.mlp.router.weight").src.str(), "4@0-3:RR");
}

// GPT-OSS's and Llama 4's names: every expert in one tensor under "experts" with no index,
// [experts, in, out]: split over ep like a group, and refused where etp would split an inner dim
// the name does not identify.
TEST(ManifestExperts, FusedWithNoIndex) {
  const std::string text = R"({
    "model.layers.0.mlp.router.weight": {"shape": [8, 16], "dtype": "BF16"},
    "model.layers.0.mlp.experts.gate_up_proj": {"shape": [8, 16, 64], "dtype": "BF16"},
    "model.layers.0.mlp.experts.gate_up_proj_bias": {"shape": [8, 64], "dtype": "BF16"},
    "model.layers.0.mlp.experts.down_proj": {"shape": [8, 32, 16], "dtype": "BF16"}})";
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "dp_size": 4, "ep_size": 4},
                                 "generation": {"num_gpus": 4, "tp_size": 2, "dp_size": 2,
                                                "ep_size": 2}})");
  const auto m = read_model(text, &sys);
  ASSERT_EQ(m.moves.size(), 4u);
  const auto& up = move(m, "model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(up.src.shape(), (Shape{8, 16, 64}));
  EXPECT_EQ(up.src.str(), "4@0-3:S0RR");  // two experts per rank
  EXPECT_EQ(range(up.src, 3, 0), "6:8");
  EXPECT_EQ(up.dst.str(), "2x2@4-7:S1RR");  // expert data parallel 2 x ep 2
  EXPECT_EQ(range(up.dst, 5, 0), "4:8");
  EXPECT_EQ(move(m, "model.layers.0.mlp.experts.gate_up_proj_bias").src.str(), "4@0-3:S0R");
  EXPECT_EQ(move(m, "model.layers.0.mlp.router.weight").src.str(), "4@0-3:RR");
  EXPECT_EQ(m.bytes(), 2 * (8 * 16 + 8 * 16 * 64 + 8 * 64 + 8 * 32 * 16));
  // One expert of a name that numbers it otherwise (SwitchTransformers' "expert_0"), and a
  // vector under "experts" (JetMoE's bias): placed as their modules say, not split over ep.
  const auto others = read_model(R"({
    "encoder.block.1.layer.1.mlp.experts.expert_0.wi.weight": {"shape": [12, 4], "dtype": "F32"},
    "layers.0.self_attention.experts.bias": {"shape": [4], "dtype": "F32"}})",
                                 &sys);
  EXPECT_EQ(others.moves[0].src.str(), "4@0-3:RR");
  EXPECT_EQ(others.moves[1].src.str(), "4@0-3:R");
  // ep 1 with tp 2: etp defaults to tp, and the name does not say which dim it would split.
  const auto tp2 = system_of(R"({"train": {"num_gpus": 2, "tp_size": 2},
                                 "generation": {"num_gpus": 1}})");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &tp2); }),
            "tensors.model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_NE(cause_of<ValidationError>([&] {
              read_model(text, &tp2);
            }).find("system.train.etp_size 2 cannot split it"),
            std::string::npos);
  // Experts that ep does not divide, as for a group.
  const auto ep3 = system_of(R"({"train": {"num_gpus": 3, "dp_size": 3, "ep_size": 3},
                                 "generation": {"num_gpus": 1}})");
  EXPECT_NE(cause_of<ValidationError>([&] {
              read_model(text, &ep3);
            }).find("8 experts do not divide over system.train.ep_size 3"),
            std::string::npos);
}

TEST(ManifestExperts, ExpertTensorParallel) {
  // 8 ranks: tp 2, dp 4, ep 2 with etp 2 -> expert mesh (edp 2, ep 2, etp 2).
  const auto sys = system_of(R"({"train": {"num_gpus": 8, "tp_size": 2, "dp_size": 4, "ep_size": 2,
                              "etp_size": 2}, "generation": {"num_gpus": 1}})");
  const auto m = read_model(mixtral(4), &sys);
  const auto& w1 = m.moves[1];
  EXPECT_EQ(w1.src.str(), "2x2x2@0-7:S1S2R");
  EXPECT_EQ(range(w1.src, 3, 0), "2:4");  // ep 1
  EXPECT_EQ(range(w1.src, 3, 1), "3:6");  // etp 1
  EXPECT_EQ(m.moves[0].dst.str(), "1@8:RR");
}

TEST(ManifestExperts, Errors) {
  const auto sys = system_of(R"({"train": {"num_gpus": 1}, "generation": {"num_gpus": 1}})");
  const std::string p = "model.layers.0.block_sparse_moe.experts.";
  // Expert 1 of 3 missing.
  std::string text =
      mixtral(1, ",\n\"" + p + "2.w1.weight\": {\"shape\": [6, 4], \"dtype\": \"BF16\"}");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors." + std::string("model.layers.0.block_sparse_moe.experts.w1.weight"));
  text = mixtral(1, ",\n\"" + p + "1.w1.weight\": {\"shape\": [6, 5], \"dtype\": \"BF16\"}");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors." + p + "1.w1.weight.shape");
  // One dtype spelled two ways is one dtype; another is refused.
  text = mixtral(1, ",\n\"" + p + "1.w1.weight\": {\"shape\": [6, 4], \"dtype\": \"bf16\"}");
  EXPECT_EQ(read_model(text, &sys).moves[1].src.shape(), (Shape{2, 6, 4}));
  text = mixtral(1, ",\n\"" + p + "1.w1.weight\": {\"shape\": [6, 4], \"dtype\": \"F32\"}");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors." + p + "1.w1.weight.dtype");
  // Two spellings of expert 1.
  text = mixtral(2, ",\n\"" + p + "01.w1.weight\": {\"shape\": [6, 4], \"dtype\": \"BF16\"}");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors." + p + "01.w1.weight");
  // A tensor named like a group of experts.
  text = mixtral(2, ",\n\"" + p + "w1.weight\": {\"shape\": [6, 4], \"dtype\": \"BF16\"}");
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors." + p + "w1.weight");
  // Experts that ep does not divide (Megatron asserts it): refused, naming the side's ep_size.
  const auto ep3 = system_of(R"({"train": {"num_gpus": 3, "dp_size": 3, "ep_size": 3},
                                 "generation": {"num_gpus": 1}})");
  const std::string w1 = "tensors.model.layers.0.block_sparse_moe.experts.w1.weight.src";
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(mixtral(4), &ep3); }), w1);
  EXPECT_NE(cause_of<ValidationError>([&] {
              read_model(mixtral(4), &ep3);
            }).find("4 experts do not divide over system.train.ep_size 3"),
            std::string::npos);
}

// Each group of experts costs memory by its entries, not by the highest index it names: 30,000
// groups that each name only expert 29,999 (7 GB of slots, were they indexed by number) are
// refused at once, naming the first group's missing expert 0.
TEST(ManifestExperts, AGroupCostsItsEntriesNotItsHighestIndex) {
  const auto sys = system_of(R"({"train": {"num_gpus": 1}, "generation": {"num_gpus": 1}})");
  const int n = 30000;
  std::string text = "{";
  for (int g = 0; g < n; ++g)
    text += (g ? ",\"g" : "\"g") + std::to_string(g) + ".experts." + std::to_string(n - 1) +
            R"(.weight": {"shape": [1], "dtype": "F32"})";
  text += "}";
  EXPECT_EQ(field_of<ValidationError>([&] { read_model(text, &sys); }),
            "tensors.g0.experts.weight");
  EXPECT_EQ(cause_of<ValidationError>([&] { read_model(text, &sys); }),
            "expert 0 of 30000 is missing");
}

TEST(ManifestPipeline, ConsecutiveLayersPerStage) {
  // 7 layers over pp 3: [0, 2), [2, 4), [4, 7); a 2-rank tp per stage.
  std::ostringstream os;
  os << "{\"transformer.wte.weight\": {\"shape\": [16, 4], \"dtype\": \"F32\"}";
  for (int l = 0; l < 7; ++l)
    os << ",\"transformer.h." << l << ".ln_1.weight\": {\"shape\": [4], \"dtype\": \"F32\"}";
  os << ",\"transformer.ln_f.weight\": {\"shape\": [4], \"dtype\": \"F32\"}}";
  const auto sys = system_of(R"({"train": {"num_gpus": 6, "tp_size": 2, "pp_size": 3},
                                 "generation": {"num_gpus": 2, "pp_size": 2}})");
  const auto m = read_model(os.str(), &sys);
  ASSERT_EQ(m.moves.size(), 9u);
  const int want_train[9] = {0, 0, 0, 1, 1, 2, 2, 2, 2};  // wte, h.0..6, ln_f
  const int want_gen[9] = {0, 0, 0, 0, 1, 1, 1, 1, 1};    // 7 over 2: [0, 3), [3, 7)
  for (std::size_t i = 0; i < 9; ++i) {
    SCOPED_TRACE(m.moves[i].name);
    EXPECT_EQ(m.moves[i].src.mesh().devices().front(), 2 * want_train[i]);
    EXPECT_EQ(m.moves[i].src.mesh().size(), 2);
    EXPECT_EQ(m.moves[i].dst.mesh().devices().front(), 6 + want_gen[i]);
  }
  EXPECT_EQ(m.moves[0].src.str(), "2@0-1:S0R");
  // No head: wte is tied, the generator's last stage (rank 7) holds it too.
  EXPECT_EQ(m.moves[0].dst.str(), "2@6-7:RR");
}

// A model with an embedding and no head ties them: the generator's last stage also holds the
// embedding (its head); the trainer sends it from its first stage. With a head, nothing moves.
TEST(ManifestPipeline, ATiedEmbeddingReachesTheLastStage) {
  const auto sys = system_of(R"({"train": {"num_gpus": 4, "tp_size": 2, "pp_size": 2},
                                 "generation": {"num_gpus": 6, "tp_size": 2, "pp_size": 3}})");
  const std::string layers = R"(
      "model.layers.0.self_attn.q_proj.weight": {"shape": [8, 4], "dtype": "BF16"},
      "model.layers.1.self_attn.q_proj.weight": {"shape": [8, 4], "dtype": "BF16"},
      "model.layers.2.self_attn.q_proj.weight": {"shape": [8, 4], "dtype": "BF16"},
      "model.norm.weight": {"shape": [4], "dtype": "BF16"})";
  const auto tied = read_model(
      R"({"model.embed_tokens.weight": {"shape": [10, 4], "dtype": "BF16"},)" + layers + "}", &sys);
  const auto& e = move(tied, "model.embed_tokens.weight");
  EXPECT_EQ(e.src.str(), "2@0-1:S0R");
  EXPECT_EQ(e.dst.str(), "2x2@[4,5,8,9]:S1R");
  EXPECT_EQ(range(e.dst, 9, 0), "5:10");  // the last stage's tp rank 1: the second half
  EXPECT_EQ(range(e.dst, 5, 0), "5:10");
  const auto untied = read_model(R"({"model.embed_tokens.weight": {"shape": [10, 4],
      "dtype": "BF16"}, "lm_head.weight": {"shape": [10, 4], "dtype": "BF16"},)" +
                                     layers + "}",
                                 &sys);
  EXPECT_EQ(move(untied, "model.embed_tokens.weight").dst.str(), "2@4-5:S0R");
  EXPECT_EQ(move(untied, "lm_head.weight").dst.str(), "2@8-9:S0R");
  // Heads under other names: inside lm_head (RoBERTa), or of no layer and the embedding's
  // shape (BERT's cls.predictions.decoder).
  for (const char* head : {"lm_head.decoder.weight", "cls.predictions.decoder.weight"}) {
    SCOPED_TRACE(head);
    const auto m = read_model(R"({"model.embed_tokens.weight": {"shape": [10, 4],
        "dtype": "BF16"}, ")" + std::string(head) +
                                  R"(": {"shape": [10, 4], "dtype": "BF16"},)" + layers + "}",
                              &sys);
    EXPECT_EQ(move(m, "model.embed_tokens.weight").dst.str(), "2@4-5:S0R");
  }
}

TEST(ManifestPlacement, ContextParallelAndFsdp) {
  // 16 ranks per side: tp 2, cp 2, dp 4, fsdp 4 -> dense mesh (replicas 2, fsdp 4, tp 2).
  const auto sys = system_of(R"({"train": {"num_gpus": 16, "tp_size": 2, "cp_size": 2,
      "dp_size": 4, "fsdp_size": 4}, "generation": {"num_gpus": 1}})");
  const auto m = read_model(R"({"model.layers.0.self_attn.q_proj.weight":
      {"shape": [16, 4], "dtype": "BF16"}, "model.layers.0.self_attn.o_proj.weight":
      {"shape": [4, 16], "dtype": "BF16"}, "model.norm.weight": {"shape": [8], "dtype": "BF16"}})",
                            &sys);
  const auto& q = m.moves[0];
  EXPECT_EQ(q.src.str(), "2x4x2@0-15:S21R");
  // Rank 3: replica 0, fsdp 1, tp 1 -> the fsdp-second quarter of tp 1's half: rows 10:12.
  EXPECT_EQ(range(q.src, 3, 0), "10:12");
  // Rank 11 (replica 1) holds the same rows as rank 3.
  EXPECT_EQ(range(q.src, 11, 0), "10:12");
  EXPECT_EQ(m.moves[1].src.str(), "2x4x2@0-15:S1S2");
  EXPECT_EQ(range(m.moves[1].src, 3, 0), "1:2");
  EXPECT_EQ(range(m.moves[1].src, 3, 1), "8:16");
  EXPECT_EQ(m.moves[2].src.str(), "2x4x2@0-15:S1");
  EXPECT_EQ(range(m.moves[2].src, 6, 0), "6:8");
}

TEST(ManifestExplicit, PartialSumsUnevenAndCasts) {
  const auto m = read_model(R"({
    "w": {"shape": [10, 6], "dtype": "f32", "src": "2x2@0-3:S0R+P1", "dst": "3@4-6:RS0",
          "dst_dtype": "bf16"},
    "b": {"shape": [7], "dtype": "F32", "src": "2@0-1:S0", "dst": "4@3-6:S0"},
    "s": {"shape": [], "dtype": "I64", "src": "1@0:", "dst": "1@8:R"}})",
                            nullptr, DType::f16);
  ASSERT_EQ(m.moves.size(), 3u);
  EXPECT_TRUE(m.moves[0].src.spec().is_partial());
  EXPECT_EQ(m.moves[0].dst.dtype(), DType::bf16);  // its own dst_dtype wins
  EXPECT_EQ(m.moves[1].dst.dtype(), DType::f16);   // the cast option
  EXPECT_EQ(m.moves[2].dst.dtype(), DType::i64);
  EXPECT_EQ(m.moves[2].src.shape(), Shape{1});  // a 0-d tensor, planned as its one element
  EXPECT_TRUE(m.moves[2].src.scalar() && m.moves[2].dst.scalar());
  EXPECT_EQ(range(m.moves[1].dst, 6, 0), "5:7");
  EXPECT_EQ(m.dtype_names, (std::vector<std::string>{"f32", "F32", "I64"}));
  EXPECT_EQ(m.trainer_devices, 4);    // 0-3
  EXPECT_EQ(m.generator_devices, 5);  // 3-6, 8
  EXPECT_EQ(m.bytes(), 240 + 28 + 8);
}

TEST(ManifestExplicit, Errors) {
  const auto f = [](const std::string& json) {
    return field_of<Error>([&] { read_model(json, nullptr); });
  };
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "f32", "src": "2@0-1:S0", "dst": "2@2-3:S0S1"}})"),
            "tensors.w.dst.spec");
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "f32", "src": "2@0-1S0", "dst": "2@2-3:S0"}})")
                .rfind("tensors.w.src", 0),
            0u);
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "f32", "src": "2@0-1:S0"}})"), "tensors.w.dst");
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "i32", "src": "2@0-1:S0", "dst": "2@2-3:S0",
                  "dst_dtype": "bf16"}})"),
            "tensors.w.dst_dtype");
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "f32", "src": "2@0-1:S0", "dst": "2@2-3:S0",
                  "dst_dtype": "bf17"}})"),
            "tensors.w.dst_dtype");
  // 8-bit floats travel as raw bytes: a pending sum of them cannot be added.
  EXPECT_EQ(f(R"({"w": {"shape": [4], "dtype": "F8_E4M3", "src": "2@0-1:R+P0",
                  "dst": "2@2-3:S0"}})"),
            "tensors.w.src");
  // Mixed forms: the first entry that differs is named.
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": "f32", "src": "2@0-1:S0", "dst": "2@2-3:S0"},
                  "b": {"shape": [4], "dtype": "f32"}})"),
            "tensors.b");
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": "F32"},
                  "b": {"shape": [4], "dtype": "f32", "src": "2@0-1:S0", "dst": "2@2-3:S0"}})"),
            "tensors.b");
  // A name over kMaxTensorNameBytes (a 30 MB one held 3.8 GB over 64 devices), shown cut short.
  const std::string longest(kMaxTensorNameBytes, 'n');
  const auto named = [](const std::string& name) {
    return R"({")" + name + R"(": {"shape": [4], "dtype": "f32", "src": "1@0:R", "dst": "1@1:R"}})";
  };
  EXPECT_EQ(read_model(named(longest), nullptr).moves.at(0).name, longest);
  EXPECT_EQ(f(named(longest + "n")), "tensors." + longest.substr(0, 160) + "...");
  // A system config does not apply to explicit layouts.
  const auto sys = system_of(kTp2Pp2ToTp2Dp2);
  EXPECT_EQ(field_of<ValidationError>([&] {
              read_model(R"({"a": {"shape": [4], "dtype": "f32", "src": "1@0:R", "dst": "1@1:R"}})",
                         &sys);
            }),
            "system");
}

TEST(ManifestModel, Errors) {
  const auto sys = system_of(kTp2Pp2ToTp2Dp2);
  const auto f = [&](const std::string& json, const SystemConfig* s) {
    return field_of<Error>([&] { read_model(json, s); });
  };
  const std::string q = "model.layers.3.self_attn.q_proj.weight";
  // A key given twice: a ParseError naming the document and the key.
  const std::string dup =
      R"({"a": {"shape": [4], "dtype": "F32"}, "a": {"shape": [4], "dtype": "F32"}})";
  EXPECT_EQ(field_of<ParseError>([&] { read_model(dup, &sys); }), "model");
  EXPECT_NE(cause_of<ParseError>([&] { read_model(dup, &sys); }).find("'a'"), std::string::npos);
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": "F32", "dtype": "F32"}})", &sys), "model");
  EXPECT_EQ(f("{\"" + q + R"(": {"shape": [4, 4], "dtype": "F4"}})", &sys),
            "tensors." + q + ".dtype");
  EXPECT_NE(cause_of<ValidationError>([&] {
              read_model("{\"" + q + R"(": {"shape": [4, 4], "dtype": "F4"}})", &sys);
            }).find("'F4'"),
            std::string::npos);
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": "F32"}})", nullptr), "system");
  EXPECT_EQ(cause_of<ValidationError>(
                [&] { read_model(R"({"a": {"shape": [4], "dtype": "F32"}})", nullptr); }),
            "required for a model config without per-tensor layouts");
  EXPECT_EQ(f(R"({"a": {"dtype": "F32"}})", &sys), "tensors.a.shape");
  EXPECT_EQ(f(R"({"a": {"shape": [4]}})", &sys), "tensors.a.dtype");
  EXPECT_EQ(f(R"({"a": {"shape": [4, -1], "dtype": "F32"}})", &sys), "tensors.a.shape");
  EXPECT_EQ(f(R"({"a": {"shape": "4", "dtype": "F32"}})", &sys), "tensors.a.shape");
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": 4}})", &sys), "tensors.a.dtype");
  EXPECT_EQ(f(R"({"a": {"shape": [4], "dtype": "F32", "dst_dtype": "bf16"}})", &sys),
            "tensors.a.dst_dtype");
  // The tensor's shape, in either form (its layouts do not overflow before it does).
  EXPECT_EQ(f(R"({"a": {"shape": [4611686018427387904, 4], "dtype": "F32"}})", &sys),
            "tensors.a.shape");
  EXPECT_EQ(f(R"({"a": {"shape": [4611686018427387904, 4], "dtype": "U8", "src": "1@0:RR",
                  "dst": "1@1:RR"}})",
              nullptr),
            "tensors.a.shape");
  EXPECT_EQ(f(R"({"a": {"shape": [1125899906842624], "dtype": "F32"}})", &sys), "model");
  EXPECT_EQ(f(R"({})", &sys), "model");
  EXPECT_EQ(f(R"([])", &sys), "model");
  EXPECT_EQ(f(R"({"a": )", &sys), "model");
  EXPECT_EQ(f(R"({"": {"shape": [4], "dtype": "F32"}})", &sys), "tensors.");
}

// ---------------------------------------------------------------------------------------------
// The shipped manifests

std::string source_path(const std::string& rel) {
  return std::string(MESHCAST_SOURCE_DIR) + "/" + rel;
}

struct Expected {
  std::int64_t entries, moves, bytes;
};

// Counts and bytes straight from the file: entries, moves (experts "<p>.experts.<i>.<rest>"
// merged per "<p>.experts.<rest>"), and bytes by the safetensors dtype widths.
Expected count(const std::string& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  const std::map<std::string, int> width{{"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F8_E4M3", 1}};
  const std::regex expert(R"(\.experts\.[0-9]+\.)");
  std::set<std::string> names;
  Expected e{0, 0, 0};
  for (const auto& [name, t] : j.items()) {
    ++e.entries;
    names.insert(std::regex_replace(name, expert, ".experts."));
    std::int64_t n = width.at(t["dtype"].get<std::string>());
    for (const auto& d : t["shape"]) n *= d.get<std::int64_t>();
    e.bytes += n;
  }
  e.moves = static_cast<std::int64_t>(names.size());
  return e;
}

TEST(ManifestShipped, EveryModelWithItsSystem) {
  struct Case {
    const char* model;
    const char* system;
    Expected want;  // also in models/README.md
  };
  const Case cases[] = {
      {"gpt2-small", "tp2pp2-to-tp2dp2", {196, 196, 497759232}},
      {"qwen2.5-0.5b", "tp2pp2-to-tp2dp2", {290, 290, 988065536}},
      {"moe-tiny", "ep4pp2-to-tp4", {267, 99, 475172864}},
      {"moe-tiny", "tp2pp2-to-tp2dp2", {267, 99, 475172864}},
      {"qwen3-235b-a22b", "qwen3-235b", {36945, 1131, 470187269120}},
      {"deepseek-v3", "deepseek-v3", {45395, 1025, 1342052868096}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.model);
    const std::string path = source_path("models/" + std::string(c.model) + ".json");
    const Expected counted = count(path);
    EXPECT_EQ(counted.entries, c.want.entries);
    EXPECT_EQ(counted.moves, c.want.moves);
    EXPECT_EQ(counted.bytes, c.want.bytes);
    const auto sys =
        load_system_config(source_path("models/systems/" + std::string(c.system) + ".json"));
    const auto m = load_model(path, &sys);
    EXPECT_EQ(static_cast<std::int64_t>(m.moves.size()), counted.moves);
    EXPECT_EQ(m.bytes(), counted.bytes);
    EXPECT_EQ(m.dtype_names.size(), m.moves.size());
    EXPECT_EQ(m.trainer_devices, sys.train.num_gpus);
    EXPECT_EQ(m.generator_devices, sys.generation.num_gpus);
    // Each side's stages cover its ranks, and nothing else.
    std::set<int> src, dst;
    for (const auto& t : m.moves) {
      src.insert(t.src.mesh().devices().begin(), t.src.mesh().devices().end());
      dst.insert(t.dst.mesh().devices().begin(), t.dst.mesh().devices().end());
    }
    EXPECT_EQ(static_cast<int>(src.size()), m.trainer_devices);
    EXPECT_EQ(*src.rbegin(), m.trainer_devices - 1);
    EXPECT_EQ(*dst.begin(), m.trainer_devices);
    EXPECT_EQ(static_cast<int>(dst.size()), m.generator_devices);
  }
}

TEST(ManifestShipped, DeepSeekPlacement) {
  const auto sys = load_system_config(source_path("models/systems/deepseek-v3.json"));
  const auto m = load_model(source_path("models/deepseek-v3.json"), &sys);
  // Train: pp 4 stages of 32 ranks (dp 32, ep 16 -> expert-dp 2); 61 layers: stage 1 owns
  // layers 15..29. Generation: tp 8 x dp 16, experts' intermediate split over tp.
  const auto& up = move(m, "model.layers.20.mlp.experts.up_proj.weight");
  EXPECT_EQ(up.src.shape(), (Shape{256, 2048, 7168}));
  EXPECT_EQ(up.src.str(), "2x16@32-63:S1RR");
  EXPECT_EQ(range(up.src, 33, 0), "16:32");
  EXPECT_EQ(up.dst.str(), "16x8@128-255:RS1R");
  EXPECT_EQ(move(m, "model.layers.15.self_attn.q_a_proj.weight").src.str(), "32@32-63:RR");
  EXPECT_EQ(move(m, "model.layers.14.self_attn.q_b_proj.weight").src.str(), "32@0-31:RR");
  EXPECT_EQ(move(m, "model.layers.60.self_attn.kv_b_proj.weight").dst.str(), "16x8@128-255:S1R");
  EXPECT_EQ(move(m, "model.layers.3.mlp.gate.e_score_correction_bias").dst.str(), "16x8@128-255:R");
  EXPECT_EQ(move(m, "lm_head.weight").src.str(), "32@96-127:RR");
}

TEST(ManifestShipped, TopologiesHoldTheSystems) {
  const auto h100 = Topology::load(source_path("meshes/h100-cluster.json"));
  EXPECT_EQ(h100.device_count(), 256);
  EXPECT_EQ(h100.nics_per_host(), 8);
  EXPECT_EQ(h100.host_of(255), 31);
  const auto gb = Topology::load(source_path("meshes/gb200-nvl72.json"));
  EXPECT_EQ(gb.device_count(), 288);
  EXPECT_EQ(gb.hosts(), 4);
  EXPECT_EQ(gb.nics_per_host(), 72);
  EXPECT_EQ(gb.nic_of(71 + 72), 71);
  EXPECT_DOUBLE_EQ(gb.nic_bandwidth(), 400e9 / 8);
  EXPECT_DOUBLE_EQ(gb.intra().bandwidth, 900e9);
  for (const char* s : {"qwen3-235b", "deepseek-v3"}) {
    const auto sys = load_system_config(source_path("models/systems/" + std::string(s) + ".json"));
    EXPECT_LE(sys.train.num_gpus + sys.generation.num_gpus, h100.device_count()) << s;
    EXPECT_LE(sys.train.num_gpus + sys.generation.num_gpus, gb.device_count()) << s;
  }
}

}  // namespace
}  // namespace meshcast
