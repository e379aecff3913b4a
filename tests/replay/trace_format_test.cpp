// The trace reader's formats (issue 23, DESIGN.md §4.2, §4.6): timestamps in any unit, as numbers or strings,
// detected by magnitude and shifted from the epoch; lenient block accounting; the Azure and BurstGPT CSV traces;
// RFC 4180 records; ids for rows without any (unique, or the prefix model); the JSONL writer's round trip.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "mc/testkit/trace_rows.hpp"
#include "mc/trace/csv.hpp"
#include "mc/trace/trace.hpp"
#include "mc/trace/trace_prefix.hpp"

namespace mc::trace {
namespace {

testkit::TraceRead read_all(const std::string& text, FormatOptions formats = {}, Mode mode = Mode::kStrict,
                            int64_t block_size = 512) {
  ReaderOptions opt;
  opt.mode = mode;
  opt.block_size = block_size;
  opt.source_name = "t.trace";
  opt.warn_on_stderr = false;
  opt.formats = std::move(formats);
  return testkit::read_trace(text, opt);
}

std::string row(const std::string& ts, int64_t input = 512, const std::string& ids = "[7]") {
  return R"({"timestamp": )" + ts + R"(, "input_length": )" + std::to_string(input) +
         R"(, "output_length": 3, "hash_ids": )" + ids + "}\n";
}

FormatOptions unit(TimeUnit u) {
  FormatOptions f;
  f.timestamp_unit = u;
  return f;
}

// ---- timestamps ----

TEST(TraceFormat, UnitDetectedByMagnitude) {
  EXPECT_EQ(detect_unit(0), TimeUnit::kMillis);  // a relative trace: Mooncake's ms
  EXPECT_EQ(detect_unit(3.6e6), TimeUnit::kMillis);
  EXPECT_EQ(detect_unit(1.7e9), TimeUnit::kSeconds);
  EXPECT_EQ(detect_unit(1.7e12), TimeUnit::kMillis);
  EXPECT_EQ(detect_unit(1.7e15), TimeUnit::kMicros);
  EXPECT_EQ(detect_unit(1.7e18), TimeUnit::kNanos);
  struct Case {
    std::string first, second;
    TimeUnit unit;
    int64_t second_ms;
  };
  for (const Case& c : {Case{"1700000000", "1700000002.5", TimeUnit::kSeconds, 2500},
                        Case{"1700000000000", "1700000002500", TimeUnit::kMillis, 2500},
                        Case{"1700000000000000", "1700000002500000", TimeUnit::kMicros, 2500},
                        Case{"1700000000000000000", "1700000002500999999", TimeUnit::kNanos, 2500},
                        Case{"0", "2500", TimeUnit::kMillis, 2500}}) {
    auto r = read_all(row(c.first) + row(c.second));
    ASSERT_TRUE(r.status.is_ok()) << c.first << ": " << r.status.message();
    ASSERT_EQ(r.rows.size(), 2u);
    EXPECT_EQ(r.stats.timestamp_unit, c.unit) << c.first;
    EXPECT_TRUE(r.stats.unit_detected) << c.first;
    EXPECT_EQ(r.rows[0].timestamp_ms, 0) << c.first;
    EXPECT_EQ(r.rows[1].timestamp_ms, c.second_ms) << c.first;  // sub-ms parts cut
  }
}

TEST(TraceFormat, EachUnitNamed) {
  // The same relative values in each unit: 3 of the unit after 0.
  struct Case {
    TimeUnit unit;
    std::string value;
    int64_t ms;
  };
  for (const Case& c : {Case{TimeUnit::kSeconds, "3", 3000}, Case{TimeUnit::kMillis, "3", 3},
                        Case{TimeUnit::kMicros, "3000", 3}, Case{TimeUnit::kNanos, "3000000", 3},
                        Case{TimeUnit::kSeconds, "0.0015", 1}, Case{TimeUnit::kMicros, "999", 0}}) {
    auto r = read_all(row("0") + row(c.value), unit(c.unit));
    ASSERT_TRUE(r.status.is_ok()) << r.status.message();
    EXPECT_EQ(r.rows[1].timestamp_ms, c.ms) << unit_name(c.unit) << " " << c.value;
    EXPECT_EQ(r.stats.timestamp_unit, c.unit);
    EXPECT_FALSE(r.stats.unit_detected);
  }
  // Named, an epoch-sized value is taken as said: 1.7e12 s is past 2^63 ns.
  auto huge = read_all(row("1700000000000"), unit(TimeUnit::kSeconds));
  EXPECT_EQ(huge.status.code(), Code::kInvalidArgument);
  EXPECT_NE(huge.status.message().find("t.trace:1: \"timestamp\" is too large"), std::string::npos)
      << huge.status.message();
  EXPECT_TRUE(parse_unit("us").is_ok());
  EXPECT_FALSE(parse_unit("minutes").is_ok());
}

TEST(TraceFormat, StringTimestampsAndExactDigits) {
  // Strings, floats and exponents, converted from their digits (no double rounding: 2^53 + 1 ns stays exact).
  auto r = read_all(row("\"0\"") + row("\"1.5e3\"") + row("2000.25") + row("\" 2001 \""));
  ASSERT_TRUE(r.status.is_ok()) << r.status.message();
  EXPECT_EQ(r.rows[1].timestamp_ms, 1500);
  EXPECT_EQ(r.rows[2].timestamp_ms, 2000);
  EXPECT_EQ(r.rows[3].timestamp_ms, 2001);
  auto v = parse_time_text("9007199254740993", "timestamp", "w");
  ASSERT_TRUE(v.is_ok());
  EXPECT_EQ(*to_ns(*v, TimeUnit::kNanos, "timestamp", "w"), 9007199254740993LL);
  auto frac = parse_time_text("0.000123456789", "timestamp", "w");
  ASSERT_TRUE(frac.is_ok());
  EXPECT_EQ(*to_ns(*frac, TimeUnit::kSeconds, "timestamp", "w"), 123456);  // truncated to whole ns
  // Dates (Azure's shape, also in JSONL), always epoch times.
  auto d = parse_time_text("2023-11-16 18:15:46.6805900", "TIMESTAMP", "w");
  ASSERT_TRUE(d.is_ok()) << d.status().message();
  EXPECT_TRUE(d->is_date);
  EXPECT_EQ(d->date_ns, 1700158546680590000LL);
  auto dt = read_all(row("\"2024-02-29T00:00:00Z\"") + row("\"2024-02-29 00:00:01.25\""));
  ASSERT_TRUE(dt.status.is_ok()) << dt.status.message();
  EXPECT_EQ(dt.rows[1].timestamp_ms, 1250);
  EXPECT_TRUE(dt.stats.dates);
  // Bad values name the line and the field.
  for (const char* bad :
       {"-1", "\"-5\"", "\"NaN\"", "\"inf\"", "\"\"", "\"12abc\"", "true", "null", "\"2023-02-29 00:00:00\"",
        "\"2023-13-01 00:00:00\"", "\"2023-11-16 25:00:00\"", "\"1e400\"", "\"1e30\""}) {
    auto r2 = read_all(row(bad));
    EXPECT_EQ(r2.status.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r2.status.message().find("t.trace:1:"), std::string::npos) << bad << ": " << r2.status.message();
    EXPECT_NE(r2.status.message().find("timestamp"), std::string::npos) << bad << ": " << r2.status.message();
  }
}

TEST(TraceFormat, EpochTimestampsStartAtZero) {
  // An epoch trace is shifted by its first row; a relative one keeps its offset.
  auto epoch = read_all(row("1700000005000") + row("1700000006000"));
  ASSERT_TRUE(epoch.status.is_ok());
  EXPECT_EQ(epoch.rows[0].timestamp_ms, 0);
  EXPECT_EQ(epoch.rows[1].timestamp_ms, 1000);
  EXPECT_EQ(epoch.stats.epoch_shift_ns, 1700000005000LL * 1000000);
  auto relative = read_all(row("5000") + row("6000"));
  EXPECT_EQ(relative.rows[0].timestamp_ms, 5000);
  EXPECT_EQ(relative.stats.epoch_shift_ns, 0);
  // A row before the first one goes back (rows must be in order), with its line.
  auto back = read_all(row("1700000005000") + row("1700000004000"));
  EXPECT_EQ(back.status.code(), Code::kInvalidArgument);
  EXPECT_NE(back.status.message().find("t.trace:2: timestamp before the first row's goes back"), std::string::npos)
      << back.status.message();
  // The header says what was decided.
  bool unit_line = false, shift_line = false;
  for (const auto& [k, v] : describe(epoch.stats, {})) {
    unit_line = unit_line || (k == "timestamp_unit" && v == "ms (detected by magnitude)");
    shift_line = shift_line || (k == "epoch_start" && v == "2023-11-14T22:13:25.000Z (shifted to 0)");
  }
  EXPECT_TRUE(unit_line);
  EXPECT_TRUE(shift_line);
}

TEST(TraceFormat, DatesWithUtcOffset) {
  // The Azure 2024 trace writes its TIMESTAMP with an offset ("2024-05-10 00:00:00.009930+00:00"): taken off.
  auto az = read_all(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,4808,10\n"
      "2024-05-10 00:00:01.014894+00:00,3180,8\n");
  ASSERT_TRUE(az.status.is_ok()) << az.status.message();
  ASSERT_EQ(az.rows.size(), 2u);
  EXPECT_EQ(az.rows[1].timestamp_ms, 1004);
  auto utc = parse_time_text("2024-05-10 00:00:00Z", "TIMESTAMP", "w");
  ASSERT_TRUE(utc.is_ok());
  for (const char* same : {"2024-05-10 02:00:00+02:00", "2024-05-10 02:00:00+0200", "2024-05-10 02:00:00+02",
                           "2024-05-09 22:30:00-01:30"}) {
    auto v = parse_time_text(same, "TIMESTAMP", "w");
    ASSERT_TRUE(v.is_ok()) << same << ": " << v.status().message();
    EXPECT_EQ(v->date_ns, utc->date_ns) << same;
  }
  for (const char* bad : {"2024-05-10 00:00:00+24:00", "2024-05-10 00:00:00+00:60", "2024-05-10 00:00:00+0",
                          "2024-05-10 00:00:00+00:00Z", "1970-01-01 00:00:00+01:00"}) {
    auto v = parse_time_text(bad, "TIMESTAMP", "w");
    EXPECT_EQ(v.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(TraceFormat, DatesAndNumbersDoNotMix) {
  // A relative trace followed by a date would put that row decades later (it was read as a 53-year span).
  auto late = read_all(row("0") + row("\"2023-01-01 00:00:00\""));
  EXPECT_EQ(late.status.code(), Code::kInvalidArgument);
  EXPECT_NE(late.status.message().find("t.trace:2: \"timestamp\" is a date and time but the earlier rows' are "
                                       "numbers"),
            std::string::npos)
      << late.status.message();
  auto number = read_all(row("\"2023-01-01 00:00:00\"") + row("5"));
  EXPECT_EQ(number.status.code(), Code::kInvalidArgument);
  EXPECT_NE(number.status.message().find("t.trace:2: \"timestamp\" is a number but the earlier rows' are dates"),
            std::string::npos)
      << number.status.message();
  // Lenient mode skips the odd row and keeps the others.
  auto lenient = read_all(row("0") + row("\"2023-01-01 00:00:00\"") + row("7"), {}, Mode::kLenient);
  ASSERT_TRUE(lenient.status.is_ok());
  ASSERT_EQ(lenient.rows.size(), 2u);
  EXPECT_EQ(lenient.rows[1].timestamp_ms, 7);
  EXPECT_EQ(lenient.stats.skipped, 1);
}

TEST(TraceFormat, HostileRowsGiveShortMessages) {
  // A value of megabytes is shown by its first bytes, not echoed whole (one bad row made an 8 MB message).
  const std::string big(1 << 20, 'x');
  for (const std::string& line :
       {R"({"timestamp": 0, "input_length": ")" + big + R"(", "output_length": 1, "hash_ids": [0]})",
        R"({"timestamp": [)" + std::string(1 << 20, '1') +
            R"(], "input_length": 1, "output_length": 1, "hash_ids": [0]})",
        R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0, ")" + big + R"("]})",
        R"({"timestamp": ")" + big}) {
    auto r = read_all(line + "\n");
    EXPECT_EQ(r.status.code(), Code::kInvalidArgument);
    EXPECT_NE(r.status.message().find("t.trace:1:"), std::string::npos) << r.status.message().substr(0, 200);
    EXPECT_LT(r.status.message().size(), 600u) << r.status.message().substr(0, 200);
  }
  // Control bytes of the file (a terminal's escape sequences) are shown as \xNN, never sent raw.
  auto esc = read_all(
      "\x1b]0;owned\x07,a\x01"
      "b\n");
  EXPECT_EQ(esc.status.code(), Code::kInvalidArgument);
  EXPECT_EQ(esc.status.message().find('\x1b'), std::string::npos) << esc.status.message();
  EXPECT_EQ(esc.status.message().find('\x07'), std::string::npos);
  EXPECT_NE(esc.status.message().find("\\x1b]0;owned\\x07,a\\x01b"), std::string::npos) << esc.status.message();
  auto field = read_all("Timestamp,Request tokens,Response tokens\n1,1\x1b[2J,3\n");
  EXPECT_NE(field.status.message().find("\"1\\x1b[2J\""), std::string::npos) << field.status.message();
  // Deep nesting is refused before it is parsed (8 Mi of '[' held 690 MB in the parser).
  auto deep = read_all(R"({"timestamp": 0, "x": )" + std::string(1 << 20, '[') + "\n");
  EXPECT_NE(deep.status.message().find("t.trace:1: JSON nested deeper than 32 levels"), std::string::npos)
      << deep.status.message().substr(0, 200);
  // Brackets inside strings are text, not nesting.
  auto text = read_all(
      R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0], "x": "[[[[\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})"
      "\n");
  EXPECT_TRUE(text.status.is_ok()) << text.status.message();
}

// ---- block accounting ----

TEST(TraceFormat, StrictBlockAccountingNamesLineAndField) {
  auto r = read_all(row("0") + row("1", 1000, "[1, 2, 3]"));
  EXPECT_EQ(r.status.code(), Code::kInvalidArgument);
  EXPECT_NE(r.status.message().find("t.trace:2: input_length 1000 needs ceil(1000/512) = 2 hash_ids, the row has 3"),
            std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("--block-accounting lenient"), std::string::npos);
}

TEST(TraceFormat, LenientBlockAccountingRecutsAndCounts) {
  // 3 ids over 1000 tokens: 333, 334, 333 tokens (rounded boundaries 0, 333, 667, 1000).
  std::vector<uint64_t> recut = recut_ids({11, 12, 13}, 1000, 100);
  ASSERT_EQ(recut.size(), 10u);
  // Blocks ending at 100..300 lie in id 11, 400..600 end in 12 (block 3 ends at token 399 >= 333), 700.. in 13.
  std::vector<uint64_t> again = recut_ids({11, 12, 13}, 1000, 100);
  EXPECT_EQ(recut, again);
  // A row with the same leading id but other lengths shares the blocks that id covers in both.
  std::vector<uint64_t> other = recut_ids({11, 99}, 700, 100);  // id 11 covers [0, 350)
  EXPECT_EQ(other[0], recut[0]);
  EXPECT_EQ(other[2], recut[2]);
  EXPECT_NE(other[3], recut[3]);  // ends at 399: id 99 here, id 12 there
  // More ids than tokens: each covers 0 or 1 token, still one id per block.
  EXPECT_EQ(recut_ids({1, 2, 3, 4, 5, 6, 7, 8}, 3, 2).size(), 2u);

  FormatOptions lenient;
  lenient.block_accounting = BlockAccounting::kLenient;
  auto r = read_all(row("0", 1000, "[11, 12, 13]") + row("1", 600, "[5, 6]") + row("2", 5000, "[1]"), lenient);
  ASSERT_TRUE(r.status.is_ok()) << r.status.message();
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[0].hash_ids.size(), 2u);                      // re-cut into ceil(1000/512) blocks
  EXPECT_EQ(r.rows[1].hash_ids, (std::vector<uint64_t>{5, 6}));  // already one id per block: kept
  EXPECT_EQ(r.rows[2].hash_ids.size(), 10u);
  EXPECT_EQ(r.stats.reblocked_rows, 2);
  bool counted = false;
  for (const auto& [k, v] : describe(r.stats, lenient)) counted = counted || (k == "reblocked_rows" && v == "2");
  EXPECT_TRUE(counted);
  // No ids at all cannot cover any token.
  auto empty = read_all(row("0", 10, "[]"), lenient);
  EXPECT_NE(empty.status.message().find("t.trace:1: \"hash_ids\" is empty"), std::string::npos)
      << empty.status.message();
}

// ---- CSV ----

TEST(TraceFormat, CsvRecordsFollowRfc4180) {
  std::vector<std::string> f;
  EXPECT_EQ(csv::split_record("a,b,,d", f).status, csv::Split::kOk);
  EXPECT_EQ(f, (std::vector<std::string>{"a", "b", "", "d"}));
  EXPECT_EQ(csv::split_record("\"x, y\",\"say \"\"hi\"\"\",", f).status, csv::Split::kOk);
  EXPECT_EQ(f, (std::vector<std::string>{"x, y", "say \"hi\"", ""}));
  EXPECT_EQ(csv::split_record("", f).status, csv::Split::kOk);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(csv::split_record("a,\"open", f).status, csv::Split::kOpenQuote);
  auto bad = csv::split_record("a,b\"c", f);
  EXPECT_EQ(bad.status, csv::Split::kBadQuote);
  EXPECT_EQ(bad.column, 2u);
  EXPECT_EQ(csv::split_record("\"a\"x", f).status, csv::Split::kBadQuote);
  EXPECT_EQ(csv::split_record(std::string(csv::kMaxCsvFields, ','), f).status, csv::Split::kTooManyFields);
  EXPECT_EQ(csv::quote_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv::quote_field("q\""), "\"q\"\"\"");
  EXPECT_EQ(csv::quote_field("plain"), "plain");
}

TEST(TraceFormat, AzureCsvDetectedAndParsed) {
  const std::string text =
      "\xEF\xBB\xBFTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
      "2023-11-16 18:15:46.6805900,1000,20\r\n"
      "\r\n"
      "2023-11-16 18:15:47.0000000,100,0\r\n"
      "2023-11-16 18:15:49.9999999, 4096 ,7\r\n";
  auto r = read_all(text);
  ASSERT_TRUE(r.status.is_ok()) << r.status.message();
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.stats.format, Format::kAzure);
  EXPECT_TRUE(r.stats.format_detected);
  EXPECT_TRUE(r.stats.dates);
  EXPECT_EQ(r.stats.header, 1);
  EXPECT_EQ(r.rows[0].timestamp_ms, 0);
  EXPECT_EQ(r.rows[1].timestamp_ms, 319);  // 47.0 - 46.68059: 319.41 ms, cut
  EXPECT_EQ(r.rows[2].timestamp_ms, 3319);
  EXPECT_EQ(r.rows[0].input_length, 1000);
  EXPECT_EQ(r.rows[0].output_length, 20);
  EXPECT_EQ(r.rows[2].input_length, 4096);
  EXPECT_EQ(r.rows[0].line_no, 2);
  EXPECT_EQ(r.rows[1].line_no, 4);
  // No ids in the file: unique ids, one per block, shared by no other row.
  EXPECT_EQ(r.rows[0].hash_ids.size(), 2u);
  EXPECT_EQ(r.rows[2].hash_ids.size(), 8u);
  std::set<uint64_t> all;
  size_t n = 0;
  for (const Request& q : r.rows) {
    all.insert(q.hash_ids.begin(), q.hash_ids.end());
    n += q.hash_ids.size();
  }
  EXPECT_EQ(all.size(), n);
  EXPECT_EQ(r.stats.synthesized_rows, 3);
  // Columns in another order, with others around them; named format; a numeric TIMESTAMP by magnitude.
  auto other =
      read_all("region,GeneratedTokens,TIMESTAMP,ContextTokens\nwest,5,1700000000.5,10\neast,6,1700000001,20\n");
  ASSERT_TRUE(other.status.is_ok()) << other.status.message();
  EXPECT_EQ(other.rows[1].timestamp_ms, 500);
  EXPECT_EQ(other.rows[1].output_length, 6);
  EXPECT_EQ(other.stats.timestamp_unit, TimeUnit::kSeconds);
}

TEST(TraceFormat, BurstGptCsvDetectedAndParsed) {
  const std::string text =
      "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
      "5,ChatGPT,472,18,490,Conversation log\n"
      "7.25,\"GPT-4, large\",1030,0,1030,API log\n"
      "9,ChatGPT,\"12\",3,15,\"multi\nline log\"\n";
  auto r = read_all(text);
  ASSERT_TRUE(r.status.is_ok()) << r.status.message();
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.stats.format, Format::kBurstGpt);
  EXPECT_EQ(r.stats.timestamp_unit, TimeUnit::kSeconds);  // BurstGPT's: seconds since the start
  EXPECT_FALSE(r.stats.unit_detected);
  EXPECT_EQ(r.rows[0].timestamp_ms, 5000);  // relative: no shift
  EXPECT_EQ(r.rows[1].timestamp_ms, 7250);
  EXPECT_EQ(r.rows[1].input_length, 1030);
  EXPECT_EQ(r.rows[1].output_length, 0);
  EXPECT_EQ(r.rows[2].input_length, 12);
  EXPECT_EQ(r.rows[2].line_no, 4);
  EXPECT_EQ(r.stats.lines, 5);  // the quoted line break spans two lines
  // Named --format picks the columns; a file of the other kind lacks them.
  FormatOptions azure;
  azure.format = Format::kAzure;
  auto wrong = read_all(text, azure);
  EXPECT_EQ(wrong.status.code(), Code::kInvalidArgument);
  EXPECT_NE(wrong.status.message().find("t.trace:1: the azure CSV header lacks column \"ContextTokens\""),
            std::string::npos)
      << wrong.status.message();
}

TEST(TraceFormat, BadCsvRowsNameLineAndField) {
  const std::string header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
  struct Case {
    std::string row, message;
  };
  for (const Case& c :
       {Case{"2023-11-16 18:15:46,-5,1", "t.trace:2: field \"ContextTokens\" = -5 is outside [1, 2147483647]"},
        Case{"2023-11-16 18:15:46,0,1", "field \"ContextTokens\" = 0 is outside"},
        Case{"2023-11-16 18:15:46,12.5,1", "field \"ContextTokens\" = \"12.5\" is not an integer"},
        Case{"2023-11-16 18:15:46,99999999999,1", "\"ContextTokens\" = 99999999999 is outside"},
        Case{"2023-11-16 18:15:46,10,NaN", "field \"GeneratedTokens\" = \"NaN\" is not an integer"},
        Case{"2023-11-16 18:15:46,10", "t.trace:2: the row has 2 fields, the header 3"},
        Case{"not a date,10,1", "\"TIMESTAMP\" = \"not a date\" is not a number"},
        Case{"2023-11-16 18:15:46,1\"0,1", "t.trace:2: field 2 has a quote inside a bare field"},
        Case{"2023-11-16 18:15:46,\"10,1", "t.trace:2: field 2 opens a quote that the file never closes"}}) {
    auto r = read_all(header + c.row + "\n");
    EXPECT_EQ(r.status.code(), Code::kInvalidArgument) << c.row;
    EXPECT_NE(r.status.message().find(c.message), std::string::npos) << c.row << ": " << r.status.message();
  }
  // Lenient mode skips them and counts.
  auto lenient = read_all(header + "2023-11-16 18:15:46,-5,1\n2023-11-16 18:15:47,10,1\n", {}, Mode::kLenient);
  ASSERT_TRUE(lenient.status.is_ok());
  EXPECT_EQ(lenient.rows.size(), 1u);
  EXPECT_EQ(lenient.stats.skipped, 1);
  EXPECT_EQ(lenient.stats.lines,
            lenient.stats.rows + lenient.stats.skipped + lenient.stats.blank + lenient.stats.header);
  // A first line of no known format fails in both modes, naming the remedy.
  for (Mode m : {Mode::kStrict, Mode::kLenient}) {
    auto unknown = read_all("a,b,c\n1,2,3\n", {}, m);
    EXPECT_EQ(unknown.status.code(), Code::kInvalidArgument);
    EXPECT_NE(unknown.status.message().find("t.trace:1: the first line is neither"), std::string::npos)
        << unknown.status.message();
    EXPECT_NE(unknown.status.message().find("--format"), std::string::npos);
  }
  // A header naming a needed column twice is ambiguous: refused, not read from the first (or the last) of them.
  for (const std::string& dup : {std::string("Timestamp,Timestamp,Request tokens,Response tokens\n5,6,100,10\n"),
                                 std::string("TIMESTAMP,ContextTokens,GeneratedTokens, contexttokens\n"
                                             "2023-11-16 18:15:46,10,1,20\n")}) {
    auto twice = read_all(dup);
    EXPECT_EQ(twice.status.code(), Code::kInvalidArgument) << dup;
    EXPECT_NE(twice.status.message().find("t.trace:1: the "), std::string::npos) << twice.status.message();
    EXPECT_NE(twice.status.message().find("twice (fields "), std::string::npos) << twice.status.message();
  }
  // A row that needs more ids than the bound is refused before any is made.
  auto huge = read_all(header + "2023-11-16 18:15:46,2000000000,1\n", {}, Mode::kStrict, 16);
  EXPECT_NE(huge.status.message().find("more than 65536 ids"), std::string::npos) << huge.status.message();
}

// ---- prefix model ----

TEST(TraceFormat, PrefixModelSpec) {
  auto m = parse_prefix_model("chat");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->system_prompts, 16);
  auto custom = parse_prefix_model("chat:system_prompts=2,system_tokens=600,zipf=0,continue=0.75,sessions=8,seed=9");
  ASSERT_TRUE(custom.is_ok()) << custom.status().message();
  EXPECT_EQ(custom->continue_probability, 0.75);
  EXPECT_EQ(to_string(*custom), "chat:system_prompts=2,system_tokens=600,zipf=0,continue=0.75,sessions=8,seed=9");
  for (const char* bad : {"markov", "chat:continue=2", "chat:sessions=0", "chat:zipf=nan", "chat:foo=1",
                          "chat:system_prompts", "chat:seed=-1"}) {
    auto r = parse_prefix_model(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--synthesize-prefixes"), std::string::npos) << r.status().message();
  }
  EXPECT_TRUE(is_none_model("none"));
  // A bad model is refused when the trace is opened.
  ReaderOptions o;
  o.formats.synthesize_prefixes = "chat:continue=7";
  EXPECT_EQ(Reader::open("-", o).status().code(), Code::kInvalidArgument);
}

std::string burst_rows(int n) {
  std::string text = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";
  uint64_t state = 5;
  for (int i = 0; i < n; ++i) {
    const int64_t in = 200 + static_cast<int64_t>(uniform01(state) * 6000);
    const int64_t out = 1 + static_cast<int64_t>(uniform01(state) * 500);
    text += std::to_string(i) + ",ChatGPT," + std::to_string(in) + "," + std::to_string(out) + ",0,API log\n";
  }
  return text;
}

TEST(TraceFormat, SynthesizedPrefixesAreDeterministicAndShared) {
  FormatOptions chat;
  chat.synthesize_prefixes = "chat:system_prompts=4,system_tokens=1024,continue=0.6,seed=3";
  const std::string text = burst_rows(300);
  auto a = read_all(text, chat);
  auto b = read_all(text, chat);
  ASSERT_TRUE(a.status.is_ok()) << a.status.message();
  ASSERT_EQ(a.rows.size(), 300u);
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].hash_ids, b.rows[i].hash_ids) << i;
    EXPECT_EQ(a.rows[i].hash_ids.size(), static_cast<size_t>((a.rows[i].input_length + 511) / 512)) << i;
  }
  // Another seed, other ids.
  chat.synthesize_prefixes = "chat:system_prompts=4,system_tokens=1024,continue=0.6,seed=4";
  EXPECT_NE(read_all(text, chat).rows[0].hash_ids, a.rows[0].hash_ids);
  // Shape: leading blocks are shared (system prompts of at least 512 tokens, session histories), and no more than
  // 4 distinct first blocks among rows that open a session with a full system block.
  std::set<uint64_t> seen, first_blocks;
  int64_t shared_blocks = 0, blocks = 0;
  for (const Request& r : a.rows) {
    for (uint64_t id : r.hash_ids) shared_blocks += seen.count(id);
    blocks += static_cast<int64_t>(r.hash_ids.size());
    seen.insert(r.hash_ids.begin(), r.hash_ids.end());
    first_blocks.insert(r.hash_ids[0]);
  }
  const double reuse = static_cast<double>(shared_blocks) / static_cast<double>(blocks);
  EXPECT_GT(reuse, 0.2) << reuse;
  EXPECT_LT(reuse, 0.95) << reuse;
  // Without a model the same rows share nothing.
  auto unique = read_all(text);
  std::set<uint64_t> u;
  size_t n = 0;
  for (const Request& r : unique.rows) {
    u.insert(r.hash_ids.begin(), r.hash_ids.end());
    n += r.hash_ids.size();
  }
  EXPECT_EQ(u.size(), n);
}

TEST(TraceFormat, SessionsGrowTheirHistory) {
  // Always continue when possible, one system prompt: row 2 (longer than row 1's prompt + answer) continues row 1's
  // session: its blocks start with row 1's complete prompt blocks, then the blocks of the answer.
  PrefixModel m;
  m.system_prompts = 1;
  m.system_tokens = 2048;
  m.continue_probability = 1.0;
  PrefixSynthesizer s(m);
  const std::vector<uint64_t> first = s.next(3000, 1000, 512);  // history 4000 tokens: 7 complete blocks
  const std::vector<uint64_t> second = s.next(4600, 10, 512);
  ASSERT_EQ(first.size(), 6u);
  ASSERT_EQ(second.size(), 9u);
  for (size_t j = 0; j < 5; ++j) EXPECT_EQ(second[j], first[j]) << j;  // row 1's 5 complete blocks
  EXPECT_NE(second[5], first[5]);  // row 1's partial block became prompt tail + answer head
  EXPECT_EQ(s.continued(), 1);
  // A new session starts with the system prompt's blocks.
  const PrefixIds ids(m.seed);
  const int64_t sys = m.system_prompt_tokens(0);
  EXPECT_EQ(first[0], ids.system_id(0, 0));
  if (sys >= 1024) {
    EXPECT_EQ(first[1], ids.system_id(0, 1));
  }
}

// ---- the JSONL writer ----

TEST(TraceFormat, ConvertRoundTripsRows) {
  FormatOptions opts;
  opts.synthesize_prefixes = "chat";
  std::string text =
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46.6805900,1000,20\n"
      "2023-11-16 18:15:47.1,3000,0\n"
      "2023-11-16 18:15:48.9,700,9\n";
  auto original = read_all(text, opts);
  ASSERT_TRUE(original.status.is_ok());
  std::string jsonl;
  for (const Request& r : original.rows) jsonl += to_jsonl(r) + "\n";
  auto again = read_all(jsonl);
  ASSERT_TRUE(again.status.is_ok()) << again.status.message();
  ASSERT_EQ(again.rows.size(), original.rows.size());
  for (size_t i = 0; i < again.rows.size(); ++i) {
    EXPECT_EQ(again.rows[i].timestamp_ms, original.rows[i].timestamp_ms);
    EXPECT_EQ(again.rows[i].input_length, original.rows[i].input_length);
    EXPECT_EQ(again.rows[i].output_length, original.rows[i].output_length);
    EXPECT_EQ(again.rows[i].hash_ids, original.rows[i].hash_ids);
  }
  // Scope fields and 64-bit ids survive; the keys come in the Mooncake order.
  Request r;
  r.timestamp_ms = 12;
  r.input_length = 1;
  r.hash_ids = {18446744073709551615ULL};
  r.scope.lora_name = "a";
  r.scope.salt = "s";
  EXPECT_EQ(to_jsonl(r),
            R"({"timestamp":12,"input_length":1,"output_length":0,"hash_ids":[18446744073709551615],"lora_name":"a",)"
            R"("salt":"s"})");
  auto back = parse_row(to_jsonl(r), 512, "w");
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->hash_ids, r.hash_ids);
  EXPECT_EQ(back->scope.salt, "s");
}

// The sample files under tests/replay/data read as their README says.
TEST(TraceFormat, SampleFiles) {
  const std::string dir = MC_SOURCE_DIR "/tests/replay/data/";
  auto read_file = [&](const std::string& name) {
    std::ifstream in(dir + name);
    std::stringstream ss;
    ss << in.rdbuf();
    return read_all(ss.str());
  };
  auto azure = read_file("azure_sample.csv");
  ASSERT_TRUE(azure.status.is_ok()) << azure.status.message();
  EXPECT_EQ(azure.rows.size(), 60u);
  EXPECT_EQ(azure.stats.format, Format::kAzure);
  auto burst = read_file("burstgpt_sample.csv");
  ASSERT_TRUE(burst.status.is_ok()) << burst.status.message();
  EXPECT_EQ(burst.rows.size(), 60u);
  auto ns = read_file("conversation_ns.jsonl");
  ASSERT_TRUE(ns.status.is_ok()) << ns.status.message();
  EXPECT_EQ(ns.stats.timestamp_unit, TimeUnit::kNanos);
  EXPECT_TRUE(ns.stats.unit_detected);
  std::ifstream conv(MC_SOURCE_DIR "/examples/traces/conversation_trace.jsonl");
  std::string line;
  for (size_t i = 0; i < ns.rows.size() && std::getline(conv, line); ++i) {
    auto want = parse_row(line, 512, "conv");
    ASSERT_TRUE(want.is_ok());
    EXPECT_EQ(ns.rows[i].timestamp_ms, want->timestamp_ms) << i;
    EXPECT_EQ(ns.rows[i].hash_ids, want->hash_ids) << i;
  }
}

}  // namespace
}  // namespace mc::trace
