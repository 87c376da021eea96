// Strict JSON reading for every input document (topology, plan, configuration, manifest):
// malformed text is a ParseError naming the field, and so is a key repeated in one object
// (nlohmann keeps the last silently, so an edited file could mean two things). And JsonWriter,
// for documents too large to build as a tree before writing them. Internal.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstring>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lib/support/text.h"
#include "meshcast/error.h"

namespace meshcast::detail {

// Nesting any reader here accepts (deeper: a ParseError, before the stack or a tree grows).
constexpr int kMaxJsonDepth = 256;
// Values parse_json() builds a tree of by default (~550 MB of empty objects at most).
constexpr std::size_t kMaxJsonValues = std::size_t{1} << 22;

// nlohmann's DOM builder, watching each object's keys, and bounding the tree: nesting as
// JsonReader does, and its values (a 60 MB file of "{}," was a tree of 2.3 GB; the documents that
// may hold millions of values, plans and manifests, are read in place by JsonReader). (nlohmann's
// callback parser would watch keys in time quadratic in an array's objects: it rescans the
// parent after every object.)
template <class Json>
class StrictJsonBuilder : public nlohmann::detail::json_sax_dom_parser<Json> {
 public:
  using Base = nlohmann::detail::json_sax_dom_parser<Json>;
  StrictJsonBuilder(Json& j, std::string field, std::size_t max_values)
      : Base(j, true), field_(std::move(field)), max_values_(max_values) {}
  bool start_object(std::size_t n) {
    open();
    keys_.emplace_back();
    return Base::start_object(n);
  }
  bool end_object() {
    --depth_;
    keys_.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    open();
    return Base::start_array(n);
  }
  bool end_array() {
    --depth_;
    return Base::end_array();
  }
  bool key(std::string& k) {
    if (!keys_.back().insert(k).second && duplicate_.empty()) duplicate_ = k;
    return Base::key(k);
  }
  bool null() { return value() && Base::null(); }
  bool boolean(bool v) { return value() && Base::boolean(v); }
  bool number_integer(typename Json::number_integer_t v) {
    return value() && Base::number_integer(v);
  }
  bool number_unsigned(typename Json::number_unsigned_t v) {
    return value() && Base::number_unsigned(v);
  }
  bool number_float(typename Json::number_float_t v, const typename Json::string_t& s) {
    return value() && Base::number_float(v, s);
  }
  bool string(typename Json::string_t& v) { return value() && Base::string(v); }
  const std::string& duplicate() const { return duplicate_; }

 private:
  void open() {
    value();
    if (++depth_ > kMaxJsonDepth) throw ParseError(field_, "not valid JSON: nested too deeply");
  }
  bool value() {
    if (++values_ > max_values_)
      throw ParseError(field_, "more than " + std::to_string(max_values_) +
                                   " JSON values (a file of this kind is far smaller)");
    return true;
  }

  std::string field_;
  std::size_t max_values_;
  int depth_ = 0;
  std::size_t values_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;  // one set per open object
  std::string duplicate_;
};

// `Json`: nlohmann::ordered_json where the order of an object's members is kept.
template <class Json = nlohmann::json>
Json parse_json(const std::string& text, const std::string& field,
                std::size_t max_values = kMaxJsonValues) {
  const auto brief = [](std::string s) {
    for (char& c : s)
      if (c < 32 || c >= 127) c = '?';
    return s.size() > 160 ? s.substr(0, 157) + "..." : s;
  };
  // nlohmann's lexer takes a NUL byte for the end of the text and ignores what follows it; JSON
  // has no raw NUL anywhere (inside a string it is escaped).
  if (const auto nul = text.find('\0'); nul != std::string::npos)
    throw ParseError(field, "not valid JSON: a NUL byte at byte " + std::to_string(nul));
  Json j;
  StrictJsonBuilder<Json> builder(j, field, max_values);
  try {
    nlohmann::json::sax_parse(text, &builder);
  } catch (const nlohmann::json::exception& e) {
    // Without nlohmann's "[json.exception.parse_error.101] ": the cause must fit the line.
    std::string_view what = e.what();
    if (what.starts_with('[') && what.find("] ") != std::string_view::npos)
      what.remove_prefix(what.find("] ") + 2);
    throw ParseError(field, "not valid JSON: " + brief(std::string(what)));
  }
  if (!builder.duplicate().empty())
    throw ParseError(field, "key '" + brief(builder.duplicate()) + "' appears twice in one object");
  return j;
}

// Reads one JSON document in place, value by value, with no tree in between (a plan of millions
// of ops would cost gigabytes of nodes). As strict as parse_json(): RFC 8259 text, UTF-8
// checked, a key repeated in one object refused; nesting is bounded (kMaxDepth). check() reads
// the whole document for syntax first, so that malformed text is reported as such whatever
// else is wrong with it; the typed reads then name the field (`where`: a string, or a callable
// returning one, evaluated only for an error).
class JsonReader {
 public:
  static constexpr int kMaxDepth = kMaxJsonDepth;
  enum class Type { Object, Array, String, Number, Bool, Null };

  JsonReader(std::string_view text, std::string field) : s_(text), field_(std::move(field)) {}

  // The whole text is one value and whitespace; rewinds to its start.
  void check() {
    // (As parse_json(): JSON has no raw NUL anywhere, and a reader that stops at one would not
    // see what follows it.)
    if (const auto nul = s_.find('\0'); nul != std::string_view::npos)
      throw ParseError(field_, "not valid JSON: a NUL byte at byte " + std::to_string(nul));
    pos_ = 0;
    skip_value(0, true);
    ws();
    if (pos_ != s_.size()) syntax("unexpected text after the document");
    pos_ = 0;
  }

  Type peek() {
    ws();
    if (pos_ == s_.size()) syntax("unexpected end of text");
    switch (s_[pos_]) {
      case '{':
        return Type::Object;
      case '[':
        return Type::Array;
      case '"':
        return Type::String;
      case 't':
      case 'f':
        return Type::Bool;
      case 'n':
        return Type::Null;
      default:
        if (s_[pos_] == '-' || (s_[pos_] >= '0' && s_[pos_] <= '9')) return Type::Number;
        syntax("unexpected character");
    }
  }

  // Calls member(key) for each member, which must read (or skip()) the value.
  template <class W, class F>
  void object(W&& where, F&& member) {
    if (peek() != Type::Object) fail(where, "expected an object");
    ++pos_;
    if (next() == '}') {
      ++pos_;
      return;
    }
    std::string key;  // its own: the value may hold objects
    while (true) {
      if (next() != '"') syntax("expected a key");
      key.clear();
      string_text(key);
      if (next() != ':') syntax("expected ':'");
      ++pos_;
      member(std::string_view(key));
      const char c = next();
      ++pos_;
      if (c == '}') return;
      if (c != ',') syntax("expected ',' or '}'");
    }
  }

  // Calls element(i) for each element, which must read (or skip()) it.
  template <class W, class F>
  void array(W&& where, F&& element) {
    if (peek() != Type::Array) fail(where, "expected an array");
    ++pos_;
    if (next() == ']') {
      ++pos_;
      return;
    }
    for (std::size_t i = 0;; ++i) {
      element(i);
      const char c = next();
      ++pos_;
      if (c == ']') return;
      if (c != ',') syntax("expected ',' or ']'");
    }
  }

  // The number of elements of the array ahead, without reading it (to bound it first). Known
  // from check() for the members of the document's object; else the array is scanned.
  template <class W>
  std::size_t count(W&& where) {
    if (peek() != Type::Array) fail(where, "expected an array");
    const std::size_t at = pos_;
    for (const auto& [p, n] : counts_)
      if (p == at) return n;
    std::size_t n = 0;
    array(where, [&](std::size_t) {
      ++n;
      skip_value(0, false);
    });
    pos_ = at;
    return n;
  }

  // A JSON integer (not 1.5, not 1e3) that fits T.
  template <class T, class W>
  T integer(W&& where) {
    if (peek() != Type::Number) fail(where, "expected an integer");
    const auto [text, is_integer] = number_text();
    if (!is_integer) fail(where, "expected an integer");
    T v{};
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size())
      fail(where, "integer out of range");
    return v;
  }

  template <class W>
  double number(W&& where) {
    if (peek() != Type::Number) fail(where, "expected a number");
    const std::string_view text = number_text().first;
    double v = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (r.ec != std::errc() || r.ptr != text.data() + text.size())
      fail(where, "number out of range");
    return v;
  }

  template <class W>
  bool boolean(W&& where) {
    if (peek() != Type::Bool) fail(where, "expected true or false");
    const bool v = s_[pos_] == 't';
    literal(v ? "true" : "false");
    return v;
  }

  template <class W>
  std::string string(W&& where) {
    if (peek() != Type::String) fail(where, "expected a string");
    std::string out;
    string_text(out);
    return out;
  }

  void skip() { skip_value(0, false); }
  // Skips the next value and returns its text (a view into the document).
  std::string_view raw() {
    ws();
    const std::size_t start = pos_;
    skip_value(0, false);
    return s_.substr(start, pos_ - start);
  }

 private:
  template <class W>
  [[noreturn]] static void fail(W&& where, const char* cause) {
    if constexpr (std::is_invocable_v<W>)
      throw ParseError(where(), cause);
    else
      throw ParseError(std::string(where), cause);
  }
  [[noreturn]] void syntax(const char* what) const {
    throw ParseError(field_,
                     "not valid JSON: " + std::string(what) + " at byte " + std::to_string(pos_));
  }

  void ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  // The next character after whitespace; end of text is an error.
  char next() {
    ws();
    if (pos_ == s_.size()) syntax("unexpected end of text");
    return s_[pos_];
  }
  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) syntax("unexpected character");
    pos_ += word.size();
  }

  // The number at pos_ by the JSON grammar, and whether it is an integer (no fraction, no
  // exponent).
  std::pair<std::string_view, bool> number_text() {
    const std::size_t start = pos_;
    const auto digits = [&] {
      const std::size_t at = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == at) syntax("expected a digit");
    };
    bool is_integer = true;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0')
      ++pos_;
    else
      digits();
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      digits();
      is_integer = false;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
      is_integer = false;
    }
    return {s_.substr(start, pos_ - start), is_integer};
  }

  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  unsigned code_unit() {  // the XXXX of \uXXXX, pos_ after the 'u'
    if (s_.size() - pos_ < 4) syntax("unexpected end of text");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const int h = hex(s_[pos_++]);
      if (h < 0) syntax("bad \\u escape");
      u = u * 16 + static_cast<unsigned>(h);
    }
    return u;
  }
  static void utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // The string at pos_ (its opening quote), decoded and appended to `out`.
  void string_text(std::string& out) {
    ++pos_;
    while (true) {
      std::size_t run = pos_;
      while (run < s_.size()) {  // a run of plain characters, copied at once
        const auto c = static_cast<unsigned char>(s_[run]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++run;
      }
      out.append(s_.data() + pos_, run - pos_);
      pos_ = run;
      if (pos_ == s_.size()) syntax("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c < 0x20) syntax("control character in a string");
      if (c >= 0x80) {
        const std::size_t n = detail::utf8_length(s_, pos_);
        if (!n) syntax("invalid UTF-8 in a string");
        out.append(s_.data() + pos_, n);
        pos_ += n;
        continue;
      }
      if (++pos_ == s_.size()) syntax("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = code_unit();
          if (cp >= 0xDC00 && cp <= 0xDFFF) syntax("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") syntax("lone high surrogate in a \\u escape");
            pos_ += 2;
            const unsigned lo = code_unit();
            if (lo < 0xDC00 || lo > 0xDFFF) syntax("lone high surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default:
          syntax("bad escape in a string");
      }
    }
  }

  // Skips one value; with `keys`, refuses a key repeated in one of its objects.
  void skip_value(int depth, bool keys) {
    if (depth > kMaxDepth) syntax("nested too deeply");
    switch (peek()) {
      case Type::Object: {
        // Keys seen in this object: compared in a list while few, in a set beyond.
        const std::size_t base = seen_;
        std::unordered_set<std::string> many;
        object(field_, [&](std::string_view key) {
          if (keys) {
            if (!many.empty()) {
              if (!many.emplace(key).second) duplicate(key);
            } else {
              for (std::size_t k = base; k < seen_; ++k)
                if (keys_[k] == key) duplicate(key);
              if (seen_ - base < kFewKeys) {
                if (seen_ == keys_.size()) keys_.emplace_back();
                keys_[seen_++].assign(key);
              } else {
                for (std::size_t k = base; k < seen_; ++k) many.insert(std::move(keys_[k]));
                many.emplace(key);
                seen_ = base;
              }
            }
          }
          skip_value(depth + 1, keys);
        });
        seen_ = base;
        return;
      }
      case Type::Array: {
        const std::size_t at = pos_;
        std::size_t n = 0;
        array(field_, [&](std::size_t) {
          ++n;
          skip_value(depth + 1, keys);
        });
        if (keys && depth == 1) counts_.emplace_back(at, n);
        return;
      }
      case Type::String:
        scratch_.clear();
        string_text(scratch_);
        return;
      case Type::Number:
        number_text();
        return;
      case Type::Bool:
        literal(s_[pos_] == 't' ? "true" : "false");
        return;
      case Type::Null:
        literal("null");
        return;
    }
  }
  [[noreturn]] void duplicate(std::string_view key) const {
    std::string k(key.substr(0, 120));
    for (char& c : k)
      if (c < 32 || c >= 127) c = '?';
    throw ParseError(field_, "key '" + k + "' appears twice in one object");
  }

  static constexpr std::size_t kFewKeys = 16;
  std::string_view s_;
  std::string field_;
  std::size_t pos_ = 0;
  std::string scratch_;
  std::vector<std::string> keys_;  // the keys of the open objects (check()), reused
  std::size_t seen_ = 0;
  std::vector<std::pair<std::size_t, std::size_t>> counts_;  // (position, elements), check()
};

// Writes one JSON document straight to a stream, value by value, with no tree in between: a
// plan of millions of ops costs a buffer, not gigabytes of nodes. Commas are placed by the
// writer; nesting is the caller's to balance. Bytes reach the stream in blocks and at flush()
// (also run by the destructor); the caller checks the stream's state.
class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& os) : os_(os), buf_(kBlock) {}
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;
  ~JsonWriter() { flush(); }

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  // An object member's name; its value (or container) comes next.
  void key(std::string_view k) {
    separate();
    string_text(k);
    put(':');
    after_key_ = true;
  }
  template <class T>
  void member(std::string_view k, const T& v) {
    key(k);
    value(v);
  }

  template <std::integral T>
  requires(!std::same_as<T, bool>) void value(T v) {
    separate();
    char* at = room(24);
    n_ += static_cast<std::size_t>(std::to_chars(at, at + 24, v).ptr - at);
    done();
  }
  void value(bool v) {
    separate();
    put(v ? std::string_view("true") : std::string_view("false"));
    done();
  }
  // The shortest text that reads back as the same double, always with a '.' or an exponent
  // (so readers see a float, as nlohmann writes it); null for infinities and NaN, as nlohmann.
  void value(double v) {
    separate();
    if (!std::isfinite(v)) {
      put("null");
    } else {
      char* at = room(40);
      const char* end = std::to_chars(at, at + 38, v).ptr;
      const auto len = static_cast<std::size_t>(end - at);
      n_ += len;
      if (std::string_view(at, len).find_first_of(".e") == std::string_view::npos) put(".0");
    }
    done();
  }
  void value(std::string_view s) {
    separate();
    string_text(s);
    done();
  }
  void value(const char* s) { value(std::string_view(s)); }
  void value(const std::string& s) { value(std::string_view(s)); }

  void flush() {
    if (n_) os_.write(buf_.data(), static_cast<std::streamsize>(n_));
    n_ = 0;
  }

 private:
  static constexpr std::size_t kBlock = std::size_t{1} << 16;

  // A room of `k` <= kBlock bytes at the end of the buffer (the caller advances n_).
  char* room(std::size_t k) {
    if (kBlock - n_ < k) flush();
    return buf_.data() + n_;
  }
  void put(char c) {
    *room(1) = c;
    ++n_;
  }
  void put(std::string_view s) {
    if (s.size() > kBlock) {
      flush();
      os_.write(s.data(), static_cast<std::streamsize>(s.size()));
      return;
    }
    std::memcpy(room(s.size()), s.data(), s.size());
    n_ += s.size();
  }
  void separate() {
    if (after_key_)
      after_key_ = false;
    else if (need_comma_)
      put(',');
  }
  void done() { need_comma_ = true; }
  void open(char c) {
    separate();
    put(c);
    need_comma_ = false;
  }
  void close(char c) {
    put(c);
    need_comma_ = true;
  }
  // Quoted. Printable ASCII is copied; anything else (escapes, UTF-8) goes through nlohmann,
  // which replaces invalid UTF-8 rather than throwing (a topology name from uniform() may hold
  // any bytes).
  void string_text(std::string_view s) {
    for (const char c : s)
      if (c < 32 || c > 126 || c == '"' || c == '\\') {
        put(nlohmann::json(std::string(s))
                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        return;
      }
    put('"');
    put(s);
    put('"');
  }

  std::ostream& os_;
  std::vector<char> buf_;
  std::size_t n_ = 0;
  bool need_comma_ = false;  // a value was written in the open container
  bool after_key_ = false;   // a key was written: its value follows without a comma
};

}  // namespace meshcast::detail
