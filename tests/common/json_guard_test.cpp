// check_json_shape (mc/common/json_guard.hpp): the bounds on an untrusted JSON text, checked before parsing.
#include "mc/common/json_guard.hpp"

#include <gtest/gtest.h>

#include <string>

namespace mc {
namespace {

TEST(JsonGuard, DepthContainersAndValuesAreBounded) {
  JsonShapeLimits lim;
  lim.max_depth = 3;
  lim.max_containers = 5;
  lim.max_values = 10;
  EXPECT_TRUE(check_json_shape(R"({"a":[[1,2]]})", lim, "body").is_ok());
  Status deep = check_json_shape(R"({"a":[[[1]]]})", lim, "body");
  EXPECT_EQ(deep.code(), Code::kInvalidArgument);
  EXPECT_EQ(deep.message(), "body: JSON nested deeper than 3 levels");
  // Closing a container frees its level: many shallow siblings are fine while the counts hold.
  EXPECT_TRUE(check_json_shape("[[],[],[]]", lim, "").is_ok());
  Status many = check_json_shape("[[],[],[],[],[]]", lim, "");
  EXPECT_EQ(many.code(), Code::kResourceExhausted);
  EXPECT_EQ(many.message(), "more than 5 JSON arrays and objects; send a smaller document");
  EXPECT_TRUE(check_json_shape("[1,2,3,4,5,6,7,8,9]", lim, "").is_ok());  // 9 values + the array
  Status values = check_json_shape("[1,2,3,4,5,6,7,8,9,10]", lim, "prompt");
  EXPECT_EQ(values.code(), Code::kResourceExhausted);
  EXPECT_NE(values.message().find("prompt: more than 10 JSON values"), std::string::npos) << values.message();
}

TEST(JsonGuard, BracketsAndCommasInsideStringsDoNotCount) {
  JsonShapeLimits lim;
  lim.max_depth = 1;
  lim.max_values = 3;
  EXPECT_TRUE(check_json_shape(R"(["[[[[,,,,", "]]\"[[,{"])", lim, "").is_ok());
  EXPECT_TRUE(check_json_shape(R"(["\\", "x"])", lim, "").is_ok());  // an escaped backslash ends before the quote
  EXPECT_FALSE(check_json_shape(R"(["\\", [1]])", lim, "").is_ok());
  // Not JSON at all is left to the parser; unbalanced closers never underflow.
  EXPECT_TRUE(check_json_shape("]]]}}} not json", lim, "").is_ok());
  EXPECT_TRUE(check_json_shape("", lim, "").is_ok());
}

TEST(JsonGuard, AHundredThousandLevelsAreRefusedAtTheLimit) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Status s = check_json_shape(deep, JsonShapeLimits{}, "the request body");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "the request body: JSON nested deeper than 64 levels");
}

}  // namespace
}  // namespace mc
