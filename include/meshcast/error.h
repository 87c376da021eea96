// The one error type the library throws: a kind, the input or operation it concerns, the cause,
// and the device that failed when a peer did.
#pragma once

#include <stdexcept>
#include <string>

namespace meshcast {

enum class ErrorKind {
  BadInput,     // malformed or inconsistent input: a mesh, a spec, a plan, an argument
  Io,           // a file that cannot be read or written
  PeerFailure,  // another device failed, left, disagreed or stopped answering
  Internal,     // a failure of this process: a transport or driver call, an unexpected state
};

// `field()` names the offending input or operation ("src.mesh", "shape", "bootstrap"); `cause()`
// says what is wrong; `device()` is the device that failed (-1 when none is known). `what()` is
// one line: "device <d>: <cause>" when a device is known, else "<field>: <cause>".
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string field, std::string cause, int device = -1)
      : std::runtime_error(device >= 0 ? "device " + std::to_string(device) + ": " + cause
                                       : field + ": " + cause),
        kind_(kind),
        field_(std::move(field)),
        cause_(std::move(cause)),
        device_(device) {}
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& cause() const noexcept { return cause_; }
  int device() const noexcept { return device_; }
  // Whether every member of the group threw this same error, having agreed on it
  // (Communicator::agree, a collective's check of its arguments): nothing of the call is left in
  // flight, and the communicator stays usable. An error not agreed may leave the peers waiting.
  bool agreed() const noexcept { return agreed_; }
  void mark_agreed() noexcept { agreed_ = true; }

 private:
  ErrorKind kind_;
  std::string field_, cause_;
  int device_;
  bool agreed_ = false;
};

// Named constructors of Error, one per kind (they add no members: catch Error and look at
// kind(), or catch these to select one kind).
class ParseError : public Error {  // malformed text: BadInput
 public:
  ParseError(std::string field, std::string cause)
      : Error(ErrorKind::BadInput, std::move(field), std::move(cause)) {}
};
class ValidationError : public Error {  // well-formed but inconsistent input: BadInput
 public:
  ValidationError(std::string field, std::string cause)
      : Error(ErrorKind::BadInput, std::move(field), std::move(cause)) {}
};
class IoError : public Error {  // Io
 public:
  IoError(std::string field, std::string cause)
      : Error(ErrorKind::Io, std::move(field), std::move(cause)) {}
};
// A peer failed: PeerFailure. With a device, field() is "peer", or "length" where the device
// sent a message of another length than the receive's; with a field and no device, the
// operation that failed with no single device to blame ("bootstrap", "iters").
class CommError : public Error {
 public:
  CommError(int device, std::string cause, std::string field = "peer")
      : Error(ErrorKind::PeerFailure, std::move(field), std::move(cause), device) {}
  CommError(std::string field, std::string cause)
      : Error(ErrorKind::PeerFailure, std::move(field), std::move(cause)) {}
};
// A call into a transport or driver (MPI, UCX, CUDA, NCCL) failed in this process: Internal.
class InternalError : public Error {
 public:
  InternalError(std::string field, std::string cause)
      : Error(ErrorKind::Internal, std::move(field), std::move(cause)) {}
};

const char* to_string(ErrorKind kind);

}  // namespace meshcast
