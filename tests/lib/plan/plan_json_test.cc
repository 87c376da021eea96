// Plan::from_json: malformed documents throw ParseError (never another exception), and
// well-formed plans whose ops leave the tensor or the meshes throw ValidationError.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <typeinfo>

#include "meshcast/error.h"
#include "meshcast/plan.h"

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

}  // namespace
}  // namespace meshcast
