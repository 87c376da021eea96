#include "meshcast/error.h"

namespace meshcast {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::BadInput:
      return "bad input";
    case ErrorKind::Io:
      return "i/o";
    case ErrorKind::PeerFailure:
      return "peer failure";
    case ErrorKind::Internal:
      return "internal";
  }
  return "internal";
}

}  // namespace meshcast
