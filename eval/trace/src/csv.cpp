#include "mc/trace/csv.hpp"

namespace mc::csv {

SplitResult split_record(std::string_view record, std::vector<std::string>& fields) {
  fields.clear();
  std::string field;
  size_t i = 0;
  const size_t n = record.size();
  while (true) {
    if (fields.size() >= kMaxCsvFields) return {Split::kTooManyFields, fields.size() + 1};
    field.clear();
    if (i < n && record[i] == '"') {
      // Quoted: up to the closing quote; "" is one quote.
      ++i;
      bool closed = false;
      while (i < n) {
        const char c = record[i++];
        if (c != '"') {
          field.push_back(c);
          continue;
        }
        if (i < n && record[i] == '"') {
          field.push_back('"');
          ++i;
          continue;
        }
        closed = true;
        break;
      }
      if (!closed) return {Split::kOpenQuote, fields.size() + 1};
      if (i < n && record[i] != ',') return {Split::kBadQuote, fields.size() + 1};
    } else {
      while (i < n && record[i] != ',') {
        if (record[i] == '"') return {Split::kBadQuote, fields.size() + 1};
        field.push_back(record[i++]);
      }
    }
    fields.push_back(field);
    if (i >= n) break;
    ++i;  // the comma: another field follows (possibly empty, at the end)
  }
  return {};
}

std::string quote_field(std::string_view field) {
  if (field.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(field);
  std::string out = "\"";
  for (char c : field) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

}  // namespace mc::csv
