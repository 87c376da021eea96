#include "meshcast/limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast {
namespace {

// A bound in bytes (a name ending in _BYTES) takes K, M, G or T.
void override_from_env(std::int64_t& value, const char* name) {
  const std::string var = std::string("MESHCAST_MAX_") + name;
  const char* text = std::getenv(var.c_str());
  if (text == nullptr) return;
  constexpr std::int64_t kMax = std::int64_t{1} << 62;
  value = var.ends_with("_BYTES") ? detail::parse_bytes(text, kMax, var)
                                  : detail::parse_uint(text, kMax, var, "value");
}

Limits from_env() {
  Limits l;
  override_from_env(l.input_file_bytes, "INPUT_FILE_BYTES");
  override_from_env(l.data_file_bytes, "DATA_FILE_BYTES");
  override_from_env(l.plan_ops, "PLAN_OPS");
  override_from_env(l.plan_memory_bytes, "PLAN_MEMORY_BYTES");
  override_from_env(l.simulate_work, "SIMULATE_WORK");
  override_from_env(l.train_search_work, "TRAIN_SEARCH_WORK");
  override_from_env(l.svg_elements, "SVG_ELEMENTS");
  override_from_env(l.buffer_bytes, "BUFFER_BYTES");
  override_from_env(l.train_memory_bytes, "TRAIN_MEMORY_BYTES");
  override_from_env(l.train_flops, "TRAIN_FLOPS");
  override_from_env(l.run_bytes, "RUN_BYTES");
  override_from_env(l.run_transfers, "RUN_TRANSFERS");
  override_from_env(l.devices, "DEVICES");
  override_from_env(l.local_threads, "LOCAL_THREADS");
  return l;
}

}  // namespace

const Limits& limits() {
  static const Limits l = from_env();
  return l;
}

void check_limit(const std::string& quantity, std::int64_t value, std::int64_t bound,
                 const char* env_name) {
  if (value <= bound) return;
  throw ValidationError(quantity, std::to_string(value) + " exceeds the limit of " +
                                      std::to_string(bound) + " (raise it with MESHCAST_MAX_" +
                                      env_name + ")");
}

std::string read_input_file(const std::string& path, const std::string& field,
                            std::int64_t max_bytes) {
  // The OS reads the path up to its first NUL: another file than the one named.
  if (path.find('\0') != std::string::npos)
    throw ValidationError(field, "the path holds a NUL byte");
  const auto cannot = [&](const std::string& why) {
    return IoError(field, "cannot read " + detail::quote(path) + ": " + why);
  };
  // A FIFO or a device is not opened (an open can wait, or act); what is opened is read
  // without blocking, for a file stat() calls regular whose read waits (/proc/kmsg waited for
  // the kernel's next line), and checked again (the path may have changed in between).
  struct stat st {};
  const auto regular = [&] {
    if (!S_ISREG(st.st_mode))
      throw ValidationError(field, detail::quote(path) + " is not a regular file");
  };
  if (::stat(path.c_str(), &st) != 0) throw cannot(std::strerror(errno));
  regular();
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw cannot(std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) throw cannot(std::strerror(errno));
  regular();
  check_limit(field + " size", st.st_size, max_bytes, "INPUT_FILE_BYTES");
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  // Read at most the bound even if the file grew since fstat().
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw cannot(errno == EAGAIN ? std::string("it has nothing to read now (not a file)")
                                   : std::string(std::strerror(errno)));
    }
    text.append(buf, static_cast<std::size_t>(n));
    check_limit(field + " size", static_cast<std::int64_t>(text.size()), max_bytes,
                "INPUT_FILE_BYTES");
  }
  return text;
}

}  // namespace meshcast
