// Typed errors: raised where a problem is detected, carrying the field it concerns.
#pragma once

#include <stdexcept>
#include <string>

namespace meshcast {

// Base of every exception the library throws. `field()` names the offending input
// ("src.mesh", "shape", "topology", ...); `what()` is one line: "<field>: <cause>".
class Error : public std::runtime_error {
 public:
  Error(std::string field, const std::string& cause)
      : std::runtime_error(field + ": " + cause), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

// Malformed text (a mesh, a spec, a shape, a dtype, a JSON document).
class ParseError : public Error {
  using Error::Error;
};

// Well-formed but inconsistent input (device count != mesh size, axis used twice, ...).
class ValidationError : public Error {
  using Error::Error;
};

// A file that cannot be read or written.
class IoError : public Error {
  using Error::Error;
};

// A communication failure (a peer that failed, a timeout, disagreeing ranks).
class CommError : public Error {
  using Error::Error;
};

}  // namespace meshcast
