// What the commands say beyond their results (--log-level, --quiet) and how: a live progress
// line on a terminal, plain lines elsewhere.
#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>

#include "cli.h"
#include "meshcast/bootstrap.h"
#include "meshcast/error.h"

namespace meshcast::cli {

LogLevel& log_level() {
  static LogLevel level = LogLevel::Info;
  return level;
}

LogLevel parse_log_level(const std::string& text) {
  if (text == "error") return LogLevel::Error;
  if (text == "warn") return LogLevel::Warn;
  if (text == "info") return LogLevel::Info;
  throw ValidationError("log-level", "expected error, warn or info, got '" + one_line(text) + "'");
}

bool says(LogLevel level) { return level <= log_level(); }

void warn(const std::string& what) {
  if (says(LogLevel::Warn)) std::cerr << "meshcast: warning: " << one_line(what) << std::endl;
}

bool live_terminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  // mpirun, srun and torchrun give their ranks ptys whose output lands in log files: a line
  // redrawn with '\r' and escape codes would fill them. A malformed launcher variable still
  // says a launcher is there.
  try {
    return !LaunchEnv::detect().has_value();
  } catch (const Error&) {
    return false;
  }
}

int terminal_columns() {
  winsize w{};
  return ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0 ? w.ws_col : 80;
}

}  // namespace meshcast::cli
