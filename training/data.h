// Training data: real text as byte-level tokens, and generated sequences for denoising.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshcast/training/engine.h"

namespace meshcast::training {

// A text corpus as bytes (tokens 0..255), split into a training part and a held-out part
// (every k-th KiB, k = 1 / held-out fraction).
struct Corpus {
  std::string source;  // where it was read from
  std::vector<std::uint8_t> train, held_out;
  // Entropy of the training bytes' unigram distribution, in nats: the loss of a model that
  // knows only how often each byte occurs (what training must beat).
  double unigram_entropy = 0;

  // Reads a regular file, or every regular file of a directory (sorted by name, symbolic links
  // skipped so that aliases count once), and holds out `held_out_fraction` (0.01..0.5) of it.
  // Throws IoError("data", ...) naming the path and the OS's reason when it cannot be read,
  // ValidationError("data", ...) when it is neither a regular file nor a directory (a FIFO, a
  // device), when its files exceed limits().data_file_bytes in all (checked before reading), or
  // when the text is too short for a sample of `min_bytes` in each part.
  static Corpus load(const std::string& path, double held_out_fraction = 0.1,
                     std::size_t min_bytes = 64);
};

// The corpus shipped by every Debian system: the license texts of base-files
// (/usr/share/common-licenses, about 260 KB of English).
inline const char* kDebianCorpus = "/usr/share/common-licenses";

// Random windows of seq + 1 bytes of `text` (training or held-out), inputs the first seq bytes
// and targets the next ones; the windows of a step are a function of (seed, step). Needs
// model.vocab >= 256 and text longer than seq.
BatchSource text_batches(const std::vector<std::uint8_t>& text, const ModelConfig& model, int batch,
                         std::uint64_t seed);

// A denoising task on generated data: each clean sample is a random walk over the vocabulary
// (each token the previous plus a step in -2..2, so that context predicts it); the inputs
// replace a `noise` fraction of its tokens by random ones, the targets are the clean tokens.
BatchSource denoising_batches(const ModelConfig& model, int batch, std::uint64_t seed,
                              double noise = 0.25);

}  // namespace meshcast::training
