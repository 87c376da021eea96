// The bench mains' one argument parser. Each option is declared once, with what it sets and a
// line of help; --help prints the declarations. A bad argument (unknown, missing its value, a
// number out of range) is one line naming the option, and exit status 2, before any work starts.
// With google_benchmark, Google Benchmark's own --benchmark_* flags stay in argv for
// benchmark::Initialize.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace meshcast::bench {

class Args {
 public:
  // `synopsis`: how the program is launched, for --help ("mpirun -np N mpi_reshard").
  Args(std::string program, std::string synopsis)
      : program_(std::move(program)), synopsis_(std::move(synopsis)) {}

  Args& flag(std::string name, bool& out, std::string help) {
    options_.push_back(
        {std::move(name), "", std::move(help), [&out](const std::string&) { out = true; }});
    return *this;
  }
  Args& text(std::string name, std::string& out, std::string help, std::string meta = "TEXT") {
    options_.push_back({std::move(name), std::move(meta), std::move(help),
                        [&out](const std::string& v) { out = v; }});
    return *this;
  }
  // An integer of at least `least`, times `unit` (--chunk-kib N sets N * 1024 bytes).
  template <class Int>
  Args& number(std::string name, Int& out, std::int64_t least, std::string help,
               std::int64_t unit = 1) {
    const std::int64_t most =
        static_cast<std::int64_t>(std::min<std::uint64_t>(
            std::numeric_limits<Int>::max(), std::numeric_limits<std::int64_t>::max())) /
        unit;
    options_.push_back(
        {std::move(name), "N", std::move(help), [&out, least, most, unit](const std::string& v) {
           out = static_cast<Int>(integer(v, least, most) * unit);
         }});
    return *this;
  }
  // One of `allowed`, whose names --help shows joined by '|'.
  Args& choice(std::string name, std::string& out, std::vector<std::string> allowed,
               std::string help) {
    std::string meta;
    for (const std::string& c : allowed) meta += (meta.empty() ? "" : "|") + c;
    return custom(
        std::move(name), meta,
        [&out, allowed, meta](const std::string& v) {
          if (std::find(allowed.begin(), allowed.end(), v) == allowed.end())
            throw std::invalid_argument("want " + meta + ", got '" + v + "'");
          out = v;
        },
        std::move(help));
  }
  // A comma-separated list replacing `out`, each item parsed by `item` (which throws
  // std::exception with the reason when it is bad); an empty item is bad too.
  template <class T>
  Args& list(std::string name, std::vector<T>& out, std::string meta,
             std::function<T(const std::string&)> item, std::string help) {
    return custom(
        std::move(name), std::move(meta),
        [&out, item = std::move(item)](const std::string& v) {
          std::vector<T> items;
          for (std::size_t at = 0;;) {
            const std::size_t comma = v.find(',', at);
            items.push_back(item(v.substr(at, comma == std::string::npos ? comma : comma - at)));
            if (comma == std::string::npos) break;
            at = comma + 1;
          }
          out = std::move(items);
        },
        std::move(help));
  }
  // Any other value: `set` parses it, throwing std::exception with the reason when it is bad.
  Args& custom(std::string name, std::string meta, std::function<void(const std::string&)> set,
               std::string help) {
    options_.push_back({std::move(name), std::move(meta), std::move(help), std::move(set)});
    return *this;
  }

  // Parses argv[1, argc); with google_benchmark, argv keeps argv[0] and the --benchmark_* flags
  // (argc shrinks to them). --help prints the options and exits 0.
  void parse(int& argc, char** argv, bool google_benchmark = false) {
    google_benchmark_ = google_benchmark;
    int kept = 1;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") usage();
      if (google_benchmark && a.rfind("--benchmark_", 0) == 0) {
        argv[kept++] = argv[i];
        continue;
      }
      const Option* o = find(a);
      if (!o) fail(a, "unknown option (--help lists them)");
      std::string value;
      if (!o->meta.empty()) {
        if (i + 1 >= argc) fail(a, "needs a value (" + o->meta + ")");
        value = argv[++i];
      }
      try {
        o->set(value);
      } catch (const std::exception& e) {
        fail(a, e.what());
      }
    }
    argc = kept;
  }

  // "want an integer in [least, most], got 'v'" unless v is one.
  static std::int64_t integer(const std::string& v, std::int64_t least, std::int64_t most) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno == ERANGE || x < least || x > most)
      throw std::invalid_argument("want an integer in [" + std::to_string(least) + ", " +
                                  std::to_string(most) + "], got '" + v + "'");
    return x;
  }

  [[noreturn]] void fail(const std::string& option, const std::string& why) const {
    std::fprintf(stderr, "%s: %s: %s\n", program_.c_str(), option.c_str(), why.c_str());
    std::exit(2);
  }

 private:
  struct Option {
    std::string name, meta, help;  // meta empty: a flag, taking no value
    std::function<void(const std::string&)> set;
  };

  const Option* find(const std::string& name) const {
    for (const Option& o : options_)
      if (o.name == name) return &o;
    return nullptr;
  }

  [[noreturn]] void usage() const {
    std::printf("usage: %s [options]\n", synopsis_.c_str());
    for (const Option& o : options_) {
      const std::string head = o.name + (o.meta.empty() ? "" : " " + o.meta);
      std::printf("  %-24s %s\n", head.c_str(), o.help.c_str());
    }
    if (google_benchmark_) std::printf("  and Google Benchmark's --benchmark_* flags\n");
    std::exit(0);
  }

  std::string program_, synopsis_;
  std::vector<Option> options_;
  bool google_benchmark_ = false;
};

}  // namespace meshcast::bench
