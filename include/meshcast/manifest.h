// Model manifests: the tensors of a whole-model sync, read from the files people already have.
//
// Two forms of one JSON object `{"<tensor name>": {...}, ...}`, told apart per file:
//
// * NCCL M2N's model config, as it is: `{"name": {"shape": [..], "dtype": "BF16", ...}}`, other
//   keys ignored. Layouts come from a system config (M2N's too) and the Megatron placement below.
// * Explicit, for any framework: every entry also has `"src": "MESH:SPEC"` and
//   `"dst": "MESH:SPEC"` (partial sums and uneven shards allowed) and may have `"dst_dtype"`
//   ("bf16" or "f16" for an f32 tensor: the sender casts); any other key is refused (a misspelt
//   dst_dtype would not cast).
//
// A file whose entries all have src and dst is explicit; one where none has either is a model
// config; anything between is refused. Errors name the offending field: "tensors.<name>.dtype",
// "tensors.<name>.src", "system.train.tp_size".
//
// Dtypes: safetensors' names (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3
// F8_E5M2) or meshcast's (f32, bf16, u8, bool, ...). Each maps to the meshcast dtype of the same
// name (BOOL to bool); the 8-bit floats, which meshcast has no dtype for, travel as i8 (bits are
// copied, never converted). The original name is kept in ModelManifest::dtype_names. A shape []
// (a scalar) is read as [1] in a model config (Megatron's placement takes a dimension); an
// explicit entry keeps it as the 0-d tensor its layouts describe.
//
// System config: `{"train": {...}, "generation": {...}}`, each with "num_gpus" (required) and
// "tp_size", "pp_size", "dp_size", "cp_size", "ep_size", "fsdp_size", "etp_size" (default 1,
// etp_size see below). Other keys are skipped (batch sizes, ...), except those that ask for a
// placement meshcast does not make, refused by name: one with "parallel" in it (an interleaved
// pipeline, Megatron's long spellings; sequence_parallel, which splits activations only, is
// skipped), one ending in "p_size" (vpp_size), one with "pipeline" or "virtual" in it
// (Megatron's uneven or virtual stages: decoder_first_pipeline_num_layers,
// num_layers_per_virtual_pipeline_stage; by name, so also one that places nothing, as
// pipeline_dtype: leave it out) or one about colocating the sides. Trainer ranks
// are [0, T), generator ranks
// [T, T + G) (T, G = the sides' num_gpus). Both sides are placed by the same rule:
//
// Rank order (Megatron-Core's "tp-cp-ep-dp-pp"): within a side, rank = ((p·dp + d)·cp + c)·tp + t
// for pipeline stage p, data-parallel index d, context-parallel index c, tensor-parallel index t:
// tp varies fastest, pp slowest, so a stage owns tp·cp·dp consecutive ranks. tp·cp·dp·pp must
// equal num_gpus (EP does not multiply: it is carved out of a stage's ranks, as in Megatron).
// Experts view the same stage ranks as (expert-dp, ep, etp) with etp fastest: ep·etp must
// divide tp·cp·dp. etp_size (Megatron's expert_tensor_parallel_size) defaults to tp_size when
// ep_size is 1 (every rank holds every expert, its inner dims split like a dense MLP: vLLM's
// TP-only MoE) and to 1 otherwise (whole experts per rank).
//
// FSDP is not an axis of its own (Megatron's FSDP shards over the data-parallel group):
// fsdp_size must divide cp·dp and the expert-dp count tp·cp·dp/(ep·etp). The fsdp ranks are the
// fastest-varying data-parallel replicas; FSDP splits dim 0 of each rank's shard further into
// fsdp contiguous blocks (for an experts tensor: each rank's experts).
//
// Placement of a tensor, by its name (the module is the component before ".weight"/".bias"):
// * pipeline: "layers.N." (or "h.N.", "layer.N.", "blocks.N.") gives layer N; with L layers
//   (the largest N + 1), stage s owns layers [⌊s·L/pp⌋, ⌊(s+1)·L/pp⌋) (uneven splits are
//   fine). A tensor of no layer goes to the last stage when it is a head (module lm_head,
//   output_layer, embed_out, or Meta's "output") or its name has "norm" or "ln_f" (the final
//   norm), else the first (embeddings, and an embedding's norm: a name with "embed" but not
//   "embed_out"). A layer or expert index of more than 9 digits is refused.
// * tied embeddings: a model with a vocabulary embedding (embed_tokens wte word_embeddings
//   tok_embeddings embed_in) and no head uses the embedding as its head, so the generator's last
//   stage holds it too (Megatron keeps that copy; dst's mesh is the first and the last stage,
//   replicas of each other). The trainer sends it from its first stage. A head is a tensor with
//   a head's module in its name (lm_head.decoder too) or, of no layer, an embedding's shape
//   (BERT's cls.predictions.decoder); a model whose head is neither (a classifier's score) is
//   taken for tied: its embedding also reaches the last stage, which is only more bytes.
// * column-parallel, dim 0 over tp (and a column layer's bias with it, as Megatron's
//   ColumnParallelLinear): q/k/v/qkv projections (q_proj k_proj v_proj qkv_proj
//   query_key_value linear_qkv wq wk wv q_b_proj kv_b_proj, and BERT's query key value),
//   gate/up (gate_proj up_proj gate_up_proj w1 w3 fc1 dense_h_to_4h linear_fc1, BERT's
//   intermediate.dense), vocabulary embeddings and heads. A fused tensor is split as one: each
//   rank gets a contiguous block of its rows, which is each rank's own q, k and v where the
//   fusion interleaves them per head group (query_key_value, linear_qkv) but not where it
//   concatenates whole parts (HF's qkv_proj, gate_up_proj); give such a model explicit layouts
//   or its parts as tensors of their own.
// * row-parallel, dim 1 over tp (bias replicated): o_proj down_proj dense (BERT's attention
//   output and output dense) out_proj w2 fc2 dense_4h_to_h linear_proj wo linear_fc2.
// * refused: c_attn, c_fc, c_proj (HF GPT-2's Conv1D stores them [in, out], GPT-BigCode's
//   linears [out, in]: the name does not say which dim to split; use the explicit form).
// * replicated: everything else — norms, row biases, MoE routers (`mlp.gate.weight` is the
//   router; `gate_proj` is not), position embeddings, MLA's down-projections (q_a_proj,
//   kv_a_proj_with_mqa), unknown modules.
// * experts: the N tensors named "<prefix>.experts.<i>.<rest>" (i = 0..N-1, same shape and
//   dtype) become ONE tensor "<prefix>.experts.<rest>" of shape [N, ...], dim 0 split over ep
//   (which must divide N, as Megatron requires), its inner dims over etp as the module's kind
//   says (column: dim 1, row: dim 2). Megatron-Core's names are grouped alike:
//   "experts.local_experts.<i>.<rest>" into "experts.local_experts.<rest>", and
//   "experts.<module>.weight<i>" (bias<i>) into "experts.<module>.weight" (bias). i numbers the
//   model's experts 0..N-1 (a whole model's config, not one ep rank's local numbering).
//   A tensor of 2 dims or more right under "experts", with no index (GPT-OSS's and Llama 4's
//   "experts.gate_up_proj", [N, in, out]), already holds every expert: dim 0 split over ep
//   likewise; where etp > 1 it is refused (the name does not say which inner dim is the output).
// * data and context parallelism replicate.
// The mesh of a tensor is its stage's ranks, axes (replicas/fsdp, fsdp, tp) for dense tensors
// and (expert-dp/fsdp, fsdp, ep, etp) for experts, axes of extent 1 left out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshcast/dtype.h"
#include "meshcast/sync.h"

namespace meshcast {

// One side's parallel degrees. etp 0: the default (tp when ep is 1, else 1).
struct ParallelConfig {
  int num_gpus = 0;
  int tp = 1, pp = 1, dp = 1, ep = 1, cp = 1, fsdp = 1, etp = 0;
};

struct SystemConfig {
  ParallelConfig train, generation;
};

// Strict JSON (a key given twice is a ParseError). Throws ParseError / ValidationError naming
// "system", "system.train.num_gpus", "system.generation.dp_size", ...
SystemConfig parse_system_config(std::string_view json);

// A model's tensors, in the file's order (a group of experts where its first expert was).
struct ModelManifest {
  std::vector<TensorMove> moves;
  std::vector<std::string> dtype_names;  // per move, as the file names it ("F8_E4M3", "f32")
  int trainer_devices = 0;     // devices of the source side (explicit form: distinct src ids)
  int generator_devices = 0;   // and of the target side
  std::int64_t bytes() const;  // source bytes of all tensors
};

// At most this many tensors in one file.
inline constexpr std::int64_t kMaxManifestTensors = std::int64_t{1} << 20;
// What a tensor of a model holds beside its boxes once read and planned by one device (its name,
// two layouts of a few small vectors each, its entries in the device's plan): about 3 KiB,
// measured with 2^20 one-element tensors (3.1 GB per rank under MPI).
inline constexpr std::int64_t kTensorPlanBytes = 3 << 10;

// Reads a model file (either form). `system` is required for a model config and refused with
// an explicit one. `cast` (bf16 or f16) is the target dtype of f32 tensors that give no
// dst_dtype; other tensors keep theirs. Throws ParseError / ValidationError naming the field;
// ValidationError("model") past kMaxManifestTensors, 2^50 bytes in all, or 2^27 mesh devices
// summed over the tensors' layouts; ValidationError("plan memory") where the tensors, at about
// 3 KiB each to read and plan, exceed limits().plan_memory_bytes.
ModelManifest read_model(std::string_view model_json, const SystemConfig* system,
                         std::optional<DType> cast = {});

// The same from files, read by read_input_file (meshcast/limits.h) under the fields "model" and
// "system".
SystemConfig load_system_config(const std::string& path);
ModelManifest load_model(const std::string& path, const SystemConfig* system,
                         std::optional<DType> cast = {});

}  // namespace meshcast
