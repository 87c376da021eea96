// Plan::from_json: malformed documents throw ParseError (never another exception), and
// well-formed plans whose ops leave the tensor or the meshes throw ValidationError. The
// streamed writer: every plan round-trips, streams included; a document without streams
// loads with its ops numbered in order.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <typeinfo>

#include "meshcast/error.h"
#include "meshcast/plan.h"
#include "support/testing.h"

namespace meshcast {
namespace {

TEST(PlanJson, MalformedInputThrowsParseError) {
  const Plan good = plan(Layout::parse({4, 6}, DType::f32, "2x2@0-3:S0R"),
                         Layout::parse({4, 6}, DType::f32, "3@4-6:RS0"));
  const nlohmann::json j = nlohmann::json::parse(good.to_json());
  ASSERT_FALSE(j["ops"].empty());
  std::vector<std::string> bad = {"",
                                  "{",
                                  "[]",
                                  "null",
                                  "42",
                                  "\"plan\"",
                                  "{}",
                                  "{\"ops\": 5}",
                                  std::string(good.to_json()).substr(0, good.to_json().size() / 2),
                                  good.to_json() + "x",
                                  "\x01\x02\xff"};
  auto mutate = [&](auto&& f) {
    nlohmann::json m = j;
    f(m);
    bad.push_back(m.dump());
  };
  mutate([](auto& m) { m.erase("ops"); });
  mutate([](auto& m) { m.erase("stats"); });
  mutate([](auto& m) { m.erase("src"); });
  mutate([](auto& m) { m["ops"] = "none"; });
  mutate([](auto& m) { m["ops"][0]["kind"] = "teleport"; });
  mutate([](auto& m) { m["ops"][0]["kind"] = 3; });
  mutate([](auto& m) { m["ops"][0]["box"] = nlohmann::json::array({nlohmann::json::array({0})}); });
  mutate([](auto& m) { m["ops"][0]["box"] = "[0:4]"; });
  mutate([](auto& m) { m["ops"][0]["peers"] = "1,2"; });
  mutate([](auto& m) { m["ops"][0]["from_dst"] = "yes"; });
  mutate([](auto& m) { m["ops"][0].erase("root"); });
  mutate([](auto& m) { m["ops"][0]["root"] = "zero"; });
  mutate([](auto& m) { m["strategy"] = "fastest"; });
  mutate([](auto& m) { m["balance"] = 1; });
  mutate([](auto& m) { m["topology"] = nullptr; });
  mutate([](auto& m) { m["stats"]["sent"] = nlohmann::json{{"x", 4}}; });
  mutate([](auto& m) { m["stats"]["sent"] = nlohmann::json{{"99999999999999", 4}}; });
  mutate([](auto& m) { m["stats"]["bytes_moved"] = "many"; });
  mutate([](auto& m) { m["src"]["dtype"] = "f33"; });
  mutate([](auto& m) { m["src"]["layout"] = "2x2@0-3"; });
  mutate([](auto& m) { m["src"]["layout"] = "2x@0-3:S0R"; });
  mutate([](auto& m) { m["src"]["shape"] = "4,6"; });
  mutate([](auto& m) { m["streams"] = "many"; });
  mutate([](auto& m) { m["ops"][0]["stream"] = 1.5; });
  mutate([](auto& m) { m["ops"][0].erase("stream"); });  // the plan has "streams"
  mutate([](auto& m) { m["ops"][0]["box"][0] = nlohmann::json::array({0, 1, 2}); });
  mutate([](auto& m) { m["stats"]["predicted_seconds"] = "soon"; });
  mutate([](auto& m) { m["ops"][0]["phase"] = 4294967296; });
  // Text that is not JSON, each at a place only a strict reader refuses.
  const std::string text = good.to_json();
  const std::size_t box = text.find("\"box\":[[") + 8;
  for (const char* s : {"01", "-", "1.", ".5", "1e", "+1", "NaN", "[0,1,]", "[0 1]", "[0,1]]"})
    bad.push_back(text.substr(0, box) + s + text.substr(text.find(']', box) + 1));
  const std::size_t topo = text.find("\"topology\":\"") + 12;
  for (const char* s : {"\x01", "\\x", "\\u12", "\\ud800", "\\udc00x", "\xc3\x28", "\xed\xa0\x80",
                        "\xf4\x90\x80\x80", "\xc0\xaf"})
    bad.push_back(text.substr(0, topo) + s + text.substr(topo));
  bad.push_back(text.substr(0, text.size() - 1) + ",}");
  bad.push_back(text.substr(0, text.size() - 1) + ",\"ops\":[]}");     // a key twice
  bad.push_back(std::string(100000, '[') + std::string(100000, ']'));  // nested too deep
  bad.push_back(text + " {}");
  bad.push_back(text + std::string(1, '\0'));
  for (const std::string& text : bad) {
    SCOPED_TRACE(text.substr(0, 200));
    try {
      const Plan p = Plan::from_json(text);
      ADD_FAILURE() << "accepted";
    } catch (const ParseError& e) {
      EXPECT_EQ(e.field().rfind("plan", 0), 0u) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ParseError: " << typeid(e).name() << ": " << e.what();
    }
  }
}

TEST(PlanJson, OpsOutsideTheTensorOrMeshesThrowValidationError) {
  const Plan good = plan(Layout::parse({4, 6}, DType::f32, "2x2@0-3:S0R"),
                         Layout::parse({4, 6}, DType::f32, "3@4-6:RS0"));
  const nlohmann::json j = nlohmann::json::parse(good.to_json());
  std::vector<std::string> bad;
  auto mutate = [&](auto&& f) {
    nlohmann::json m = j;
    f(m);
    bad.push_back(m.dump());
  };
  using nlohmann::json;
  mutate([](auto& m) {
    m["ops"][0]["box"] = json::array({json::array({0, 5}), json::array({0, 6})});
  });
  mutate([](auto& m) {
    m["ops"][0]["box"] = json::array({json::array({-1, 2}), json::array({0, 6})});
  });
  mutate([](auto& m) {
    m["ops"][0]["box"] = json::array({json::array({0, 4}), json::array({0, 600})});
  });
  mutate([](auto& m) { m["ops"][0]["box"] = json::array({json::array({0, 4})}); });
  mutate([](auto& m) { m["ops"][0]["root"] = 99; });
  mutate([](auto& m) { m["ops"][0]["peers"] = json::array({77}); });
  mutate([](auto& m) { m["ops"][0]["phase"] = -1; });
  for (const std::string& text : bad) {
    SCOPED_TRACE(text.substr(0, 300));
    try {
      const Plan p = Plan::from_json(text);
      ADD_FAILURE() << "accepted";
    } catch (const ValidationError& e) {
      EXPECT_EQ(e.field().rfind("plan", 0), 0u) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ValidationError: " << e.what();
    }
  }
}

// Arbitrary text for a topology name: quotes, backslashes, control characters, UTF-8.
std::string random_text(testing::Rng& rng) {
  const std::vector<std::string> pieces = {"a",
                                           "host",
                                           "\"",
                                           "\\",
                                           "/",
                                           "\n",
                                           "\t",
                                           "\x01",
                                           "\x1f",
                                           "\x7f",
                                           "\xc3\xa9",
                                           "\xe2\x82\xac",
                                           "\xf0\x9f\x98\x80",
                                           " ",
                                           "{",
                                           "]"};
  std::string s;
  for (auto n = rng.below(8); n > 0; --n) s += rng.pick(pieces);
  return s;
}

// A plan as the planner makes it, with what a planner does not make: streams numbered sparsely
// and out of order, any prediction, a topology name that needs escapes.
Plan random_plan(testing::Rng& rng, int i) {
  testing::Limits lim;
  lim.max_volume = 200;
  const auto c = testing::random_case(rng, lim);
  PlanOptions opt;
  opt.strategy = static_cast<Strategy>(rng.below(4));
  opt.balance = static_cast<Balance>(rng.below(3));
  opt.search_moves = 50;
  opt.search_seconds = 1e9;
  const Plan p = plan(c.src, c.dst, Topology::single_host(), opt);
  std::vector<Op> ops = p.ops();
  std::vector<std::int64_t> streams(ops.size());
  const std::int64_t spread = 1 + rng.below(3);
  for (std::size_t k = 0; k < ops.size(); ++k) streams[k] = static_cast<std::int64_t>(k) * spread;
  rng.shuffle(streams);
  for (std::size_t k = 0; k < ops.size(); ++k) ops[k].stream = streams[k];
  PlanStats st = p.stats();
  const double seconds[] = {0.0, 1.0, 0.1, 1.0 / 3, 1e-300, 5e-324, 1e300, 123456789.125};
  st.predicted_seconds = seconds[rng.below(8)] * (i % 3 == 0 ? 1 : std::ldexp(1.0, -i % 40));
  st.search_truncated = rng.chance(1, 2);
  const auto n = static_cast<std::int64_t>(ops.size());
  return Plan(p.src(), p.dst(), p.strategy(), static_cast<Balance>(rng.below(4)), random_text(rng),
              std::move(ops), std::move(st), n * spread + rng.below(5));
}

// Property: every plan reads back equal from its document, which write_json() streams byte for
// byte as to_json() returns it, and which any JSON reader takes.
TEST(PlanJson, RandomPlansRoundTrip) {
  testing::Rng rng(0x15011);
  for (int i = 0; i < testing::scaled(400); ++i) {
    const Plan p = random_plan(rng, i);
    const std::string text = p.to_json();
    SCOPED_TRACE(text.substr(0, 600));
    std::ostringstream os;
    p.write_json(os);
    ASSERT_EQ(os.str(), text);
    ASSERT_TRUE(Plan::from_json(text) == p);
    const nlohmann::json j = nlohmann::json::parse(text);
    ASSERT_EQ(j["streams"], p.streams());
    ASSERT_EQ(j["ops"].size(), p.ops().size());
    for (std::size_t k = 0; k < p.ops().size(); ++k)
      ASSERT_EQ(j["ops"][k]["stream"], p.ops()[k].stream);
    ASSERT_EQ(j["topology"], p.topology());
    // Any JSON writer's text of the same document reads the same (key order, spacing, escapes).
    ASSERT_TRUE(Plan::from_json(j.dump(1, '\t', true)) == p);
  }
}

// Property: a saved plan's byte counts are its ops' (the run bound and the reported bandwidth
// are taken from them): any one changed is refused naming it; the prediction is not checked.
TEST(PlanJson, SavedByteCountsMustBeTheOps) {
  testing::Rng rng(0x57a75);
  int checked = 0;
  for (int i = 0; i < testing::scaled(200); ++i) {
    const Plan p = random_plan(rng, i);
    const nlohmann::json good = nlohmann::json::parse(p.to_json());
    const nlohmann::json& st = good["stats"];
    std::vector<std::pair<std::string, nlohmann::json>> edits;  // field, document
    auto edit = [&](const std::string& field, auto&& change) {
      nlohmann::json j = good;
      change(j["stats"]);
      edits.emplace_back(field, std::move(j));
    };
    edit("plan.stats.bytes_moved",
         [](nlohmann::json& s) { s["bytes_moved"] = s["bytes_moved"].get<std::int64_t>() + 1; });
    edit("plan.stats.bytes_local",
         [](nlohmann::json& s) { s["bytes_local"] = s["bytes_local"].get<std::int64_t>() + 4; });
    edit("plan.stats.bytes_network", [](nlohmann::json& s) {
      s["bytes_network"] = s["bytes_network"].get<std::int64_t>() + 1;
    });
    edit("plan.stats.sent", [](nlohmann::json& s) { s["sent"]["1000001"] = 0; });
    if (!st["sent"].empty()) {
      const std::string d = st["sent"].begin().key();
      edit("plan.stats.sent." + d,
           [&](nlohmann::json& s) { s["sent"][d] = s["sent"][d].get<std::int64_t>() * 2; });
      edit("plan.stats.received." + st["received"].begin().key(),
           [](nlohmann::json& s) { s["received"].erase(s["received"].begin()); });
    }
    for (const auto& [field, j] : edits) {
      SCOPED_TRACE(field);
      try {
        (void)Plan::from_json(j.dump());
        ADD_FAILURE() << "accepted";
      } catch (const ValidationError& e) {
        EXPECT_EQ(e.field(), field) << e.what();
        ++checked;
      }
    }
    nlohmann::json j = good;
    j["stats"]["predicted_seconds"] = 42.5;
    EXPECT_EQ(Plan::from_json(j.dump()).stats().predicted_seconds, 42.5);
  }
  EXPECT_GT(checked, testing::scaled(200) * 4);
}

// A document of before streams (or written by hand) loads with its ops numbered in order;
// "ops[i].stream" without "streams" is ignored.
TEST(PlanJson, DocumentWithoutStreamsIsNumberedInOrder) {
  const Plan good = plan(Layout::parse({4, 6}, DType::f32, "2x2@0-3:S0R"),
                         Layout::parse({4, 6}, DType::f32, "3@4-6:RS0"));
  nlohmann::json j = nlohmann::json::parse(good.to_json());
  j.erase("streams");
  for (auto& op : j["ops"]) op["stream"] = 7;
  const Plan p = Plan::from_json(j.dump());
  ASSERT_EQ(p.streams(), static_cast<std::int64_t>(p.ops().size()));
  for (std::size_t k = 0; k < p.ops().size(); ++k)
    EXPECT_EQ(p.ops()[k].stream, static_cast<std::int64_t>(k));
  for (auto& op : j["ops"]) op.erase("stream");
  EXPECT_TRUE(Plan::from_json(j.dump()) == p);
  // With "streams", every op says its own.
  j["streams"] = 6;
  try {
    (void)Plan::from_json(j.dump());
    ADD_FAILURE() << "accepted";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.field(), "plan.ops[0].stream") << e.what();
  }
  j["streams"] = -1;
  for (std::size_t k = 0; k < j["ops"].size(); ++k) j["ops"][k]["stream"] = k;
  try {
    (void)Plan::from_json(j.dump());
    ADD_FAILURE() << "accepted";
  } catch (const ValidationError& e) {
    EXPECT_EQ(e.field(), "plan.streams") << e.what();
  }
}

// The reader's strictness on what a tree builder would hide: a key repeated inside an op (also
// spelled with an escape), members it does not know (ignored), escapes decoded.
TEST(PlanJson, ReaderIsStrictAndDecodesEscapes) {
  const Plan good = plan(Layout::parse({4, 6}, DType::f32, "2x2@0-3:S0R"),
                         Layout::parse({4, 6}, DType::f32, "3@4-6:RS0"));
  const std::string text = good.to_json();
  const std::size_t op = text.find("{\"kind\"");
  for (const char* dup : {"\"root\":1,", "\"r\\u006fot\":1,"}) {
    std::string t = text;
    t.insert(op + 1, dup);
    try {
      (void)Plan::from_json(t);
      ADD_FAILURE() << "accepted " << dup;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find("appears twice"), std::string::npos) << e.what();
    }
  }
  std::string t = text;
  t.insert(op + 1, "\"note\":{\"a\":[1,2.5e-3,null,true,\"\\u00e9\\ud83d\\ude00\"]},");
  t.insert(1, " \n\t\"x\" : { } ,\r");
  EXPECT_TRUE(Plan::from_json(t) == good);
  // Escaped text decodes: the topology name comes back as written.
  nlohmann::json j = nlohmann::json::parse(text);
  j["topology"] = "caf\u00e9 \"q\" \\ \x01 \U0001F600";
  const Plan p = Plan::from_json(j.dump());
  EXPECT_EQ(p.topology(), j["topology"].get<std::string>());
  EXPECT_TRUE(Plan::from_json(p.to_json()) == p);
}

}  // namespace
}  // namespace meshcast
