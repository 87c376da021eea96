// Shared pieces of the Google Benchmark suites in bench/: the smoke switch (smoke.h), the
// load average, console options, and a console reporter that keeps each benchmark's repetitions for
// one closing table (nccl-tests style: a row per benchmark, medians over repetitions).
#pragma once

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "args.h"
#include "smoke.h"
#include "stats.h"

namespace meshcast::bench {

// The 1-minute load average (0 where /proc/loadavg is missing): how busy the shared machine was.
inline double load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  double load = 0;
  if (f) {
    if (std::fscanf(f, "%lf", &load) != 1) load = 0;
    std::fclose(f);
  }
  return load;
}

// Colour as Google Benchmark's own console would: --benchmark_color=true|false|auto (a terminal).
// Call before benchmark::Initialize, which consumes the flag.
inline benchmark::ConsoleReporter::OutputOptions console_options(int argc, char** argv) {
  bool color = isatty(STDOUT_FILENO) != 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i], flag = "--benchmark_color=";
    if (a.rfind(flag, 0) != 0) continue;
    const std::string v = a.substr(flag.size());
    color = v == "true" || v == "yes" || v == "1" || (v == "auto" && isatty(STDOUT_FILENO));
  }
  return color ? benchmark::ConsoleReporter::OO_ColorTabular
               : benchmark::ConsoleReporter::OO_Tabular;
}

// The console output, plus a closing table written by print_table() from every benchmark's
// iteration runs (repetitions may arrive interleaved; rows come in registration order).
class TableReporter : public benchmark::ConsoleReporter {
 public:
  struct Row {
    std::string name;       // the registered name
    std::int64_t family;    // registration order
    std::vector<Run> runs;  // one per repetition
    std::string error;      // SkipWithError's message, if any
    double median(const char* counter) const {
      std::vector<double> v;
      for (const Run& r : runs) v.push_back(r.counters.at(counter).value);
      return bench::median(v);
    }
    double max(const char* counter) const {
      double m = 0;
      for (const Run& r : runs) m = std::max(m, r.counters.at(counter).value);
      return m;
    }
  };

  explicit TableReporter(OutputOptions options) : ConsoleReporter(options) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const std::string& name = r.run_name.function_name;
      auto [at, fresh] = index_.try_emplace(name, rows_.size());
      if (fresh) rows_.push_back({name, r.family_index, {}, {}});
      Row& row = rows_[at->second];
      if (r.error_occurred) {
        row.error = r.error_message;
        failed_ = true;
      } else if (r.run_type == Run::RT_Iteration) {
        row.runs.push_back(r);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::vector<Row> rows = rows_;
    std::stable_sort(rows.begin(), rows.end(),
                     [](const Row& a, const Row& b) { return a.family < b.family; });
    std::fflush(stdout);
    print_table(stdout, rows);
    std::fflush(stdout);
  }

  // True once a benchmark failed or print_table() called fail().
  bool failed() const { return failed_; }

 protected:
  virtual void print_table(std::FILE* f, const std::vector<Row>& rows) = 0;
  void fail() { failed_ = true; }

 private:
  std::map<std::string, std::size_t> index_;
  std::vector<Row> rows_;
  bool failed_ = false;
};

// Registers nothing: initialises Google Benchmark, runs every registered benchmark through
// `reporter`, and returns the process status (2: bad arguments, 1: a failure, 0: all good).
// `program` takes no options of its own: Args refuses all but Google Benchmark's.
inline int run(const char* program, int argc, char** argv, TableReporter& reporter) {
  Args(program, program).parse(argc, argv, true);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return reporter.failed() ? 1 : 0;
}

}  // namespace meshcast::bench
