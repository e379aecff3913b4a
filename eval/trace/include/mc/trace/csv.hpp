// RFC 4180 records (the CSV traces of DESIGN.md §4.2: Azure LLM inference, BurstGPT).
//
// A record is fields separated by commas. A field is either bare (no quote in it) or quoted: it starts with a
// double quote, ends with one, and holds commas, line breaks and doubled quotes ("" = one quote) in between.
// After a closing quote only a comma or the end of the record may follow. Line ends (LF or CRLF) are the
// caller's: a reader that reads line by line hands the record so far to split_csv_record(), and on kOpenQuote
// appends "\n" and the next line (the record's quoted field goes on) and calls it again.
// Bounds: at most kMaxCsvFields fields per record (more: kTooManyFields); the caller bounds the record's bytes.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace mc::csv {

inline constexpr size_t kMaxCsvFields = 1024;

enum class Split {
  kOk,             // `fields` holds the record's fields, unquoted
  kOpenQuote,      // a quoted field is still open at the end: the record goes on past a line break
  kBadQuote,       // a quote inside a bare field, or text after a closing quote (`column` names the field)
  kTooManyFields,  // more than kMaxCsvFields fields
};

struct SplitResult {
  Split status = Split::kOk;
  size_t column = 0;  // 1-based field of a kBadQuote
};

// Splits one record (no trailing line break) into `fields` (cleared first).
SplitResult split_record(std::string_view record, std::vector<std::string>& fields);

// A field as it must be written: quoted (quotes doubled) when it holds a comma, a quote, CR or LF.
std::string quote_field(std::string_view field);

}  // namespace mc::csv
