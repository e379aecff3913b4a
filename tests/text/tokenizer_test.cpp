#include <gtest/gtest.h>

#include "mc/text/tokenizer.hpp"
TEST(Tokenizer, Compiles) { EXPECT_FALSE(mc::text::Tokenizer::from_json("{", "x").is_ok()); }
