#include "mc/report/page.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "mc/common/log.hpp"

namespace mc::report {

namespace {

constexpr std::string_view kStyle = R"css(
body { font-family: "Liberation Sans", Arial, Helvetica, sans-serif; margin: 24px 32px; color: #222; background: #fafafa; }
h1 { font-size: 24px; margin: 0 0 4px 0; }
p.subtitle { margin: 0 0 14px 0; color: #555; }
dl.info { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 13px; margin: 0 0 16px 0; }
dl.info dt { color: #666; } dl.info dd { margin: 0; font-family: "Liberation Mono", monospace; overflow-wrap: anywhere; }
table.figures { border-collapse: collapse; font-size: 13px; margin: 0 0 18px 0; background: #fff; }
table.figures th, table.figures td { border: 1px solid #ddd; padding: 4px 8px; text-align: right; }
table.figures th { background: #eef2f7; } table.figures td:first-child, table.figures th:first-child { text-align: left; }
div.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 18px; }
figure.chart { margin: 0; background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px; }
figure.chart svg { width: 100%; height: auto; display: block; }
figure.chart figcaption { font-size: 12.5px; color: #444; padding: 4px 6px 2px 6px; }
ul.notes { font-size: 13px; color: #555; }
)css";

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string inline_svg(std::string_view svg, std::string_view id) {
  std::string s(svg);
  if (s.rfind("<?xml", 0) == 0) {
    const size_t end = s.find("?>");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  const std::string p = std::string(id) + "-";
  // gnuplot's ids (its point symbols, filters, canvas and plot groups) and the references to them. Chart text
  // cannot contain quotes or '#' (chart_text), so these patterns only match gnuplot's own markup.
  for (std::string_view name : {"gpPt", "gpDot", "textbox", "greybox", "gpBkgnd"}) {
    replace_all(s, "id='" + std::string(name), "id='" + p + std::string(name));
    replace_all(s, "#" + std::string(name), "#" + p + std::string(name));
  }
  replace_all(s, "id=\"gnuplot_canvas\"", "id=\"" + p + "gnuplot_canvas\"");
  // A plot group appears twice when the key is opaque (the key's samples are drawn again on top): the second of
  // each becomes "<id>-gnuplot_key_N", so ids stay unique.
  std::vector<std::string> seen;
  const std::string group = "id=\"gnuplot_plot_";
  for (size_t at = s.find(group); at != std::string::npos; at = s.find(group, at + 1)) {
    const size_t end = s.find('"', at + group.size());
    if (end == std::string::npos) break;
    const std::string n = s.substr(at + group.size(), end - at - group.size());
    const bool again = std::find(seen.begin(), seen.end(), n) != seen.end();
    if (!again) seen.push_back(n);
    const std::string renamed = "id=\"" + p + (again ? "gnuplot_key_" : "gnuplot_plot_") + n + "\"";
    s.replace(at, end + 1 - at, renamed);
  }
  const size_t start = s.find_first_not_of(" \r\n");
  return start == std::string::npos ? std::string() : s.substr(start);
}

Result<std::string> page_html(const Page& page, const std::vector<std::string>& svgs) {
  if (svgs.size() != page.charts.size()) {
    return error(Code::kInvalidArgument, "page '" + page.title + "': " + std::to_string(page.charts.size()) +
                                             " charts but " + std::to_string(svgs.size()) + " drawings");
  }
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    << "<title>" << html_escape(page.title) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  h << "<h1>" << html_escape(page.title) << "</h1>\n";
  if (!page.subtitle.empty()) h << "<p class=\"subtitle\">" << html_escape(page.subtitle) << "</p>\n";
  if (!page.info.empty()) {
    h << "<dl class=\"info\">\n";
    for (const auto& [k, v] : page.info) h << "<dt>" << html_escape(k) << "</dt><dd>" << html_escape(v) << "</dd>\n";
    h << "</dl>\n";
  }
  if (!page.table.empty()) {
    h << "<table class=\"figures\">\n";
    for (size_t r = 0; r < page.table.size(); ++r) {
      const char* cell = r == 0 ? "th" : "td";
      h << "<tr>";
      for (const std::string& c : page.table[r]) h << "<" << cell << ">" << html_escape(c) << "</" << cell << ">";
      h << "</tr>\n";
    }
    h << "</table>\n";
  }
  h << "<div class=\"charts\">\n";
  for (size_t i = 0; i < page.charts.size(); ++i) {
    const Chart& c = page.charts[i];
    std::string per_series;
    for (const Series& s : c.series) per_series += (per_series.empty() ? "" : ",") + std::to_string(s.points.size());
    h << "<figure class=\"chart\" id=\"chart-" << html_escape(c.id) << "\" data-chart=\"" << html_escape(c.id)
      << "\" data-series=\"" << c.series.size() << "\" data-points=\"" << c.points() << "\" data-series-points=\""
      << per_series << "\">\n"
      << inline_svg(svgs[i], c.id) << "\n<figcaption>" << html_escape(c.caption) << "</figcaption>\n</figure>\n";
  }
  h << "</div>\n";
  if (!page.notes.empty()) {
    h << "<ul class=\"notes\">\n";
    for (const std::string& n : page.notes) h << "<li>" << html_escape(n) << "</li>\n";
    h << "</ul>\n";
  }
  h << "</body>\n</html>\n";
  return h.str();
}

Status write_page(const Page& page, const PageOutput& output) {
  if (output.html_path.empty() && output.svg_dir.empty()) return Status::ok();
  MC_ASSIGN_OR_RETURN(std::vector<std::string> svgs, render_svg(page.charts, output.render));
  if (!output.svg_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(output.svg_dir, ec);
    if (ec) {
      return error(Code::kIo, "cannot make the SVG directory " + output.svg_dir + ": " + ec.message() +
                                  " (--svg names a directory)");
    }
    for (size_t i = 0; i < svgs.size(); ++i) {
      const std::string path = output.svg_dir + "/" + page.charts[i].id + ".svg";
      std::ofstream f(path, std::ios::trunc | std::ios::binary);
      f << svgs[i];
      if (!f.flush()) return error(Code::kIo, "cannot write " + path + ": " + std::strerror(errno));
    }
  }
  if (!output.html_path.empty()) {
    MC_ASSIGN_OR_RETURN(std::string html, page_html(page, svgs));
    std::ofstream f(output.html_path, std::ios::trunc | std::ios::binary);
    f << html;
    if (!f.flush()) {
      return error(Code::kIo, "cannot write the HTML report " + output.html_path + ": " + std::strerror(errno));
    }
    MC_LOG_INFO << "HTML report: " << output.html_path << " (" << page.charts.size() << " charts)";
  }
  if (!output.svg_dir.empty()) MC_LOG_INFO << "SVG charts: " << output.svg_dir << "/<chart>.svg";
  return Status::ok();
}

}  // namespace mc::report
