// A flag raised for a scope: true while the scope runs, false again however it ends (a
// function that must not be re-entered, or left alone by a poll, while it is on the stack).
#pragma once

namespace meshcast::detail {

class Raised {
 public:
  explicit Raised(bool& flag) : flag_(flag) { flag_ = true; }
  ~Raised() { flag_ = false; }
  Raised(const Raised&) = delete;
  Raised& operator=(const Raised&) = delete;

 private:
  bool& flag_;
};

}  // namespace meshcast::detail
