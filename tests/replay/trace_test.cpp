#include "mc/trace/trace.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "mc/common/input_file.hpp"
#include "mc/testkit/trace_rows.hpp"

namespace mc::trace {
namespace {

testkit::TraceRead read_all(const std::string& text, Mode mode) {
  ReaderOptions opt;
  opt.mode = mode;
  opt.source_name = "t.jsonl";
  opt.warn_on_stderr = false;
  return testkit::read_trace(text, opt);
}

const char* kValid1 = R"({"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [0, 1]})";
const char* kValid6 = R"({"timestamp": 3000, "input_length": 512, "output_length": 5, "hash_ids": [0]})";

// Field report #18: the malformed row of the released trace and its neighbours.
std::string report18_file(const std::string& eol) {
  return std::string(kValid1) + eol +
         R"({"timestamp": 0, "input_length": 17448, "output_length":2748 610, "hash_ids": []})" + eol + eol +
         R"({"timestamp": 0, "input_length": 512, "output_length": 1})" + eol +
         R"({"timestamp": 0, "input_length": 512.5, "output_length": 1, "hash_ids": [0]})" + eol + kValid6;
}

// Regression (tests/fuzz/fuzz_trace): a number too large for a double ("1e999") made the JSON parser throw
// out_of_range, which the reader did not catch (std::terminate); it is a bad row like any other.
TEST(Trace, NumberOverflowIsABadRowNotACrash) {
  const std::string line = R"({"timestamp": 1e999, "input_length": 1, "output_length": 1, "hash_ids": [0]})";
  auto row = parse_row(line, 512, "t.jsonl:1");
  ASSERT_FALSE(row.is_ok());
  EXPECT_EQ(row.status().code(), Code::kInvalidArgument);
  EXPECT_NE(row.status().message().find("not valid JSON"), std::string::npos) << row.status().message();
  std::istringstream in(line + "\n" + R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]})");
  ReaderOptions options;
  options.mode = Mode::kLenient;
  options.warn_on_stderr = false;
  Reader lenient(in, options);
  auto next = lenient.next();
  ASSERT_TRUE(next.is_ok()) << next.status().to_string();
  ASSERT_TRUE(next->has_value());
  EXPECT_EQ(lenient.stats().skipped, 1);
}

TEST(Trace, StrictNamesTheFirstBadLine) {
  auto r = read_all(report18_file("\n"), Mode::kStrict);
  ASSERT_FALSE(r.status.is_ok());
  EXPECT_EQ(r.status.code(), Code::kInvalidArgument);
  EXPECT_NE(r.status.message().find("t.jsonl:2:"), std::string::npos) << r.status.message();
  EXPECT_EQ(r.rows.size(), 1u);
}

TEST(Trace, LenientSkipsAndCounts) {
  for (std::string eol : {"\n", "\r\n"}) {
    for (std::string bom : {"", "\xEF\xBB\xBF"}) {
      auto r = read_all(bom + report18_file(eol), Mode::kLenient);
      ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
      ASSERT_EQ(r.rows.size(), 2u);
      EXPECT_EQ(r.rows[0].line_no, 1);
      EXPECT_EQ(r.rows[0].output_length, 10);
      EXPECT_EQ(r.rows[1].line_no, 6);
      EXPECT_EQ(r.rows[1].timestamp_ms, 3000);
      EXPECT_EQ(r.stats.skipped, 3);
      EXPECT_EQ(r.stats.blank, 1);
      ASSERT_EQ(r.stats.first_errors.size(), 3u);
      EXPECT_NE(r.stats.first_errors[0].find("t.jsonl:2:"), std::string::npos);
      EXPECT_NE(r.stats.first_errors[1].find("t.jsonl:4: missing field \"hash_ids\""), std::string::npos);
      EXPECT_NE(r.stats.first_errors[2].find("t.jsonl:5: \"input_length\" must be an integer"), std::string::npos);
    }
  }
}

TEST(Trace, TimestampsMissingOrBackwards) {
  std::string text = std::string(kValid6) + "\n" + kValid1 + "\n";
  auto strict = read_all(text, Mode::kStrict);
  ASSERT_FALSE(strict.status.is_ok());
  EXPECT_NE(strict.status.message().find("t.jsonl:2: timestamp 0 ms goes back from 3000 ms"), std::string::npos);
  auto lenient = read_all(text, Mode::kLenient);
  EXPECT_EQ(lenient.rows.size(), 1u);
  EXPECT_EQ(lenient.stats.skipped, 1);
  auto missing = read_all(R"({"input_length": 512, "output_length": 1, "hash_ids": [0]})", Mode::kStrict);
  ASSERT_FALSE(missing.status.is_ok());
  EXPECT_NE(missing.status.message().find("missing field \"timestamp\""), std::string::npos);
}

// Field report #17: 64-bit ids stay distinct; out-of-range and negative ids are rejected.
TEST(Trace, SixtyFourBitIds) {
  std::string text;
  for (const char* id : {"0", "4294967296", "9007199254740992", "9007199254740993", "18446744073709551615"}) {
    text += std::string(R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [)") + id + "]}\n";
  }
  auto r = read_all(text, Mode::kStrict);
  ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
  std::set<uint64_t> ids;
  for (auto& row : r.rows) ids.insert(row.hash_ids[0]);
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_TRUE(ids.count(9007199254740993ULL));
  EXPECT_TRUE(ids.count(18446744073709551615ULL));
  for (const char* bad : {"18446744073709551616", "-1", "1.5", "\"7\""}) {
    auto b = read_all(
        std::string(R"({"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [)") + bad + "]}\n",
        Mode::kStrict);
    ASSERT_FALSE(b.status.is_ok()) << bad;
    EXPECT_NE(b.status.message().find("t.jsonl:1: hash_ids[0]"), std::string::npos) << b.status.message();
  }
}

// Field report #19: the id count must be ceil(input_length / block_size).
TEST(Trace, IdCountMatchesBlocks) {
  auto row = [](int64_t len, int n) {
    std::string ids;
    for (int i = 0; i < n; ++i) ids += (i ? "," : "") + std::to_string(i);
    return R"({"timestamp": 0, "input_length": )" + std::to_string(len) + R"(, "output_length": 1, "hash_ids": [)" +
           ids + "]}";
  };
  EXPECT_TRUE(parse_row(row(17448, 35), 512, "x").is_ok());
  EXPECT_TRUE(parse_row(row(1024, 2), 512, "x").is_ok());
  EXPECT_TRUE(parse_row(row(1025, 3), 512, "x").is_ok());
  auto twenty = parse_row(row(20, 2), 512, "x");
  ASSERT_FALSE(twenty.is_ok());
  EXPECT_NE(twenty.status().message().find("needs ceil(20/512) = 1 hash_ids, the row has 2"), std::string::npos);
  EXPECT_FALSE(parse_row(row(10, 0), 512, "x").is_ok());
  EXPECT_FALSE(parse_row(row(17448, 34), 512, "x").is_ok());
  auto zero = parse_row(row(0, 0), 512, "x");
  ASSERT_FALSE(zero.is_ok());
  EXPECT_NE(zero.status().message().find("\"input_length\" = 0"), std::string::npos);
}

TEST(Trace, EmptyInputAndNoTrailingNewline) {
  auto empty = read_all("", Mode::kStrict);
  EXPECT_TRUE(empty.status.is_ok());
  EXPECT_TRUE(empty.rows.empty());
  auto one = read_all(kValid1, Mode::kStrict);
  ASSERT_EQ(one.rows.size(), 1u);
  EXPECT_EQ(one.rows[0].hash_ids, (std::vector<uint64_t>{0, 1}));
}

TEST(Trace, ShippedConversationTrace) {
  ReaderOptions opt;
  auto reader = Reader::open(std::string(MC_SOURCE_DIR) + "/examples/traces/conversation_trace.jsonl", opt);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  int64_t rows = 0, blocks = 0, input_tokens = 0;
  std::set<uint64_t> distinct;
  while (true) {
    auto row = (*reader)->next();
    ASSERT_TRUE(row.is_ok()) << row.status().to_string();
    if (!row->has_value()) break;
    ++rows;
    blocks += static_cast<int64_t>((*row)->hash_ids.size());
    input_tokens += (*row)->input_length;
    distinct.insert((*row)->hash_ids.begin(), (*row)->hash_ids.end());
  }
  // Figures of ../shared/traces/README.md.
  EXPECT_EQ(rows, 12031);
  EXPECT_EQ(blocks, 288500);
  EXPECT_EQ(distinct.size(), 182790u);
  EXPECT_NEAR(static_cast<double>(input_tokens) / static_cast<double>(rows), 12035.0, 0.5);  // the mean, rounded
  EXPECT_EQ((*reader)->stats().skipped, 0);
}

// The optional key scope of a row (DESIGN.md §4.1): absent = base model, no salt; strings only.
TEST(Trace, OptionalKeyScope) {
  auto r = read_all(std::string(kValid1) + "\n" +
                        R"({"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [5], )"
                        R"("lora_name": "sql", "lora_version": "v2", "salt": "tenant-7"})" +
                        "\n",
                    Mode::kStrict);
  ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_TRUE(r.rows[0].scope.empty());
  EXPECT_EQ(r.rows[1].scope, (RequestKeyScope{"sql", "v2", "tenant-7"}));
  auto bad_type =
      read_all(R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [5], "salt": 7})", Mode::kStrict);
  EXPECT_EQ(bad_type.status.code(), Code::kInvalidArgument);
  EXPECT_NE(bad_type.status.message().find("t.jsonl:1: \"salt\" must be a string"), std::string::npos)
      << bad_type.status.message();
  auto no_name =
      read_all(R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [5], "lora_version": "1"})",
               Mode::kStrict);
  EXPECT_NE(no_name.status.message().find("lora_version '1' without lora_name"), std::string::npos)
      << no_name.status.message();
}

// Issue 17 item 5: a line is read with a bound; the rest of a longer one stays unread (no newline: no growth).
TEST(Trace, LinesAreBounded) {
  std::istringstream in("abc\n" + std::string(40, 'x') + "\nlast");
  std::string line;
  EXPECT_EQ(read_line_bounded(in, line, 16), LineRead::kLine);
  EXPECT_EQ(line, "abc");
  EXPECT_EQ(read_line_bounded(in, line, 16), LineRead::kTooLong);
  EXPECT_EQ(line, std::string(16, 'x'));
  in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  EXPECT_EQ(read_line_bounded(in, line, 16), LineRead::kLine);
  EXPECT_EQ(line, "last");
  EXPECT_EQ(read_line_bounded(in, line, 16), LineRead::kEnd);
  std::istringstream exact(std::string(16, 'y') + "\n");
  EXPECT_EQ(read_line_bounded(exact, line, 16), LineRead::kLine);  // exactly the bound fits
  // A trace row longer than the bound: strict names its line; lenient skips it and reads on.
  const std::string row = R"({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]})";
  std::istringstream huge(std::string(kMaxInputLineBytes + 10, ' ') + "x\n" + row + "\n");
  ReaderOptions o;
  o.block_size = 512;
  o.source_name = "huge.jsonl";
  o.warn_on_stderr = false;
  Reader strict(huge, o);
  auto r = strict.next();
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("huge.jsonl:1"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("longer than 16 MiB"), std::string::npos) << r.status().message();
  std::istringstream huge2(std::string(kMaxInputLineBytes + 10, ' ') + "x\n" + row + "\n");
  o.mode = Mode::kLenient;
  Reader lenient(huge2, o);
  auto l = lenient.next();
  ASSERT_TRUE(l.is_ok()) << l.status().to_string();
  ASSERT_TRUE(l->has_value());
  EXPECT_EQ((*l)->line_no, 2);
  EXPECT_EQ(lenient.stats().skipped, 1);
}

TEST(Trace, MissingFileIsBadInput) {
  auto r = Reader::open("/nonexistent/trace.jsonl", ReaderOptions{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);  // a user mistake: exit 2 (input_file.hpp)
  EXPECT_NE(r.status().message().find("/nonexistent/trace.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace mc::trace
