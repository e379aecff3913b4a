#include "mc/common/units.hpp"

#include <gtest/gtest.h>

namespace mc::units {
namespace {

TEST(Units, Sizes) {
  EXPECT_EQ(parse_size_bytes("4096").value(), 4096);
  EXPECT_EQ(parse_size_bytes("64KiB").value(), 65536);
  EXPECT_EQ(parse_size_bytes("1GiB").value(), 1LL << 30);
  EXPECT_EQ(parse_size_bytes("1.5GB").value(), 1'500'000'000);
  EXPECT_EQ(parse_size_bytes("4GiB").value(), 4LL << 30);
  EXPECT_FALSE(parse_size_bytes("").is_ok());
  EXPECT_FALSE(parse_size_bytes("abc").is_ok());
  EXPECT_FALSE(parse_size_bytes("12 parsecs").is_ok());
  EXPECT_FALSE(parse_size_bytes("99999999999TiB").is_ok());
  EXPECT_FALSE(parse_size_bytes("-1").is_ok());
}

TEST(Units, Counts) {
  EXPECT_EQ(parse_count("3M").value(), 3'000'000);
  EXPECT_EQ(parse_count("1,000,000").value(), 1'000'000);
  EXPECT_FALSE(parse_count("3MiB").is_ok());
  auto list = parse_count_list("1M,3M,10M,50M");
  ASSERT_TRUE(list.is_ok());
  EXPECT_EQ(list.value(), (std::vector<int64_t>{1'000'000, 3'000'000, 10'000'000, 50'000'000}));
  auto sizes = parse_size_list("64KiB,1MiB,4MiB");
  ASSERT_TRUE(sizes.is_ok());
  EXPECT_EQ(sizes.value(), (std::vector<int64_t>{65536, 1 << 20, 4 << 20}));
  EXPECT_FALSE(parse_size_list("64KiB,,1MiB").is_ok());
}

TEST(Units, Format) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(1LL << 30), "1.00 GiB");
}

}  // namespace
}  // namespace mc::units
