// Parsing and printing of quantities on command lines: sizes ("64KiB", "1GiB", "4096", "1.5MB"),
// token counts ("3M", "50M", "1,000,000"), lists ("64KiB,1MiB,4MiB"). Binary suffixes (KiB, MiB,
// GiB, TiB) are powers of 1024; decimal ones (K/KB, M/MB, G/GB, T/TB) powers of 1000.
// Errors: kInvalidArgument naming the text and the accepted forms; values that overflow int64 fail.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::units {

Result<int64_t> parse_size_bytes(std::string_view text);
Result<int64_t> parse_count(std::string_view text);  // "3M" -> 3,000,000
Result<std::vector<int64_t>> parse_size_list(std::string_view text);
Result<std::vector<int64_t>> parse_count_list(std::string_view text);
// "64 KiB", "1.50 GiB"
std::string format_bytes(int64_t bytes);

}  // namespace mc::units
