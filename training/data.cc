#include "training/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "lib/support/text.h"
#include "meshcast/error.h"
#include "meshcast/limits.h"
#include "training/ops.h"

namespace meshcast::training {
namespace {

namespace fs = std::filesystem;

// The files of a corpus: `path` itself when it is a regular file, else the regular files directly
// in the directory `path`, sorted by name, symbolic links skipped (so that aliases count once).
// Anything else (a FIFO, a device such as /dev/zero) is refused: it could block or never end.
std::vector<fs::path> corpus_files(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw IoError("data", "cannot read " + detail::quote(path) + ": " + std::strerror(errno));
  if (S_ISREG(st.st_mode)) return {path};
  if (!S_ISDIR(st.st_mode))
    throw ValidationError("data",
                          detail::quote(path) + " is neither a regular file nor a directory");
  std::vector<fs::path> files;
  std::error_code ec;
  fs::directory_iterator it(path, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec))
    if (!it->is_symlink(ec) && it->is_regular_file(ec)) files.push_back(it->path());
  if (ec) throw IoError("data", "cannot list " + detail::quote(path) + ": " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

std::uint64_t mix(std::uint64_t seed, int step) {
  return seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(step) + 0x632BE59BD9B4E019ULL;
}

}  // namespace

Corpus Corpus::load(const std::string& path, double held_out_fraction, std::size_t min_bytes) {
  Corpus c;
  c.source = path;
  if (!(held_out_fraction >= 0.01 && held_out_fraction <= 0.5))
    throw ValidationError("data", "the held-out fraction must be in [0.01, 0.5]");
  const auto files = corpus_files(path);
  // The whole corpus is held in memory: bound it before reading any of it.
  std::int64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    if (ec) throw IoError("data", "cannot read " + detail::quote(f.string()) + ": " + ec.message());
    total += static_cast<std::int64_t>(size);
  }
  const std::int64_t bound = limits().data_file_bytes;
  check_limit("data size", total, bound, "DATA_FILE_BYTES");
  std::string all;
  for (const auto& f : files)
    all += read_input_file(f.string(), "data", bound - static_cast<std::int64_t>(all.size()));
  // Every k-th block of 1 KiB is held out, so that both parts sample every text (a tail would
  // be one license, unlike the rest).
  const std::size_t block = 1024;
  const auto k = static_cast<std::size_t>(std::lround(1 / held_out_fraction));
  for (std::size_t at = 0, i = 0; at < all.size(); at += block, ++i) {
    auto& part = i % k == k - 1 ? c.held_out : c.train;
    part.insert(part.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
                all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), at + block)));
  }
  if (c.train.size() < min_bytes || c.held_out.size() < min_bytes) {
    // Held out enough once its j-th block (in the j*k-th place) holds the rest of min_bytes.
    const std::size_t j = (min_bytes + block - 1) / block;
    const std::size_t need = (j * k - 1) * block + min_bytes - (j - 1) * block;
    throw ValidationError(
        "data", path + ": " + std::to_string(all.size()) + " bytes are too few for samples of " +
                    std::to_string(min_bytes) + " in training and held-out text (every " +
                    std::to_string(k) + "th block of " + std::to_string(block) +
                    " bytes is held out: it needs at least " + std::to_string(need) + " bytes)");
  }
  std::array<double, 256> count{};
  for (auto b : c.train) count[b] += 1;
  for (double n : count)
    if (n > 0) {
      const double p = n / static_cast<double>(c.train.size());
      c.unigram_entropy -= p * std::log(p);
    }
  return c;
}

BatchSource text_batches(const std::vector<std::uint8_t>& text, const ModelConfig& model, int batch,
                         std::uint64_t seed) {
  if (model.vocab < 256)
    throw ValidationError("vocab", "byte-level text needs a vocabulary of at least 256, got " +
                                       std::to_string(model.vocab));
  if (text.size() <= static_cast<std::size_t>(model.seq) + 1)
    throw ValidationError("seq", "the text has " + std::to_string(text.size()) +
                                     " bytes, too few for samples of " + std::to_string(model.seq) +
                                     " tokens");
  return [&text, model, batch, seed](int step, Batch& out) {
    Rng rng(mix(seed, step));
    const auto s = static_cast<std::size_t>(model.seq);
    const std::uint64_t starts = text.size() - s;
    out.inputs.clear();
    out.targets.clear();
    for (int b = 0; b < batch; ++b) {
      const auto at = static_cast<std::size_t>(rng.next() % starts);
      out.inputs.insert(out.inputs.end(), text.begin() + static_cast<std::ptrdiff_t>(at),
                        text.begin() + static_cast<std::ptrdiff_t>(at + s));
      out.targets.insert(out.targets.end(), text.begin() + static_cast<std::ptrdiff_t>(at + 1),
                         text.begin() + static_cast<std::ptrdiff_t>(at + s + 1));
    }
  };
}

BatchSource denoising_batches(const ModelConfig& model, int batch, std::uint64_t seed,
                              double noise) {
  return [model, batch, seed, noise](int step, Batch& out) {
    Rng rng(mix(seed, step) ^ 0xD1B54A32D192ED03ULL);
    const auto v = static_cast<std::uint64_t>(model.vocab);
    out.inputs.clear();
    out.targets.clear();
    for (int b = 0; b < batch; ++b) {
      std::uint64_t t = rng.next() % v;
      for (int i = 0; i < model.seq; ++i) {
        t = (t + v + rng.next() % 5 - 2) % v;
        out.targets.push_back(static_cast<std::int32_t>(t));
        out.inputs.push_back(static_cast<std::int32_t>(rng.uniform() < noise ? rng.next() % v : t));
      }
    }
  };
}

}  // namespace meshcast::training
