// A free port on 127.0.0.1 for a test job's rendezvous (tests/support/free_port.py's twin for
// C++ tests). It is drawn below the kernel's ephemeral range (32768 up by default), so that no
// connection elsewhere, nor a rank's connect meeting itself, can take it before rank 0 listens.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>

namespace meshcast::testing {

// With `pair`, the port below is free too (torchrun's MASTER_PORT is the one below meshcast's).
inline int free_port(bool pair = false) {
  static std::mt19937 draw(std::random_device{}());
  const auto bindable = [](int port) {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool bound = s >= 0 && ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (s >= 0) ::close(s);
    return bound;
  };
  // The ephemeral range's start, as the kernel says (its default where it cannot be read).
  int hi = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); !(range >> hi)) hi = 32768;
  if (hi <= 20002) hi = 65536;  // an odd machine's range: any port, as before
  for (int tries = 0; tries < 1000; ++tries) {
    const int port = std::uniform_int_distribution<int>(20001, hi - 1)(draw);
    if (bindable(port) && (!pair || bindable(port - 1))) return port;
  }
  ADD_FAILURE() << "no free port in [20000, " << hi << ")";
  return 0;
}

}  // namespace meshcast::testing
