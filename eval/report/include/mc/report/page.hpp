// The HTML report page (DESIGN.md §5 "Pictures"; library mc_report_html): one self-contained file, no script, no
// link, nothing fetched, that opens offline: a header (what ran, from which files), a table, and the charts as
// inline SVG drawn by gnuplot (chart.hpp), each with a caption saying what is drawn and how it was derived.
//
// Each chart is <figure class="chart" id="chart-ID" data-chart="ID" data-series="S" data-points="N"
// data-series-points="n1,n2,..."> holding the SVG, so a browser test can check that every series has its points
// (chart.hpp says how points are drawn): series N's points are in the group "<id>-gnuplot_plot_N", its key sample in
// "<id>-gnuplot_key_N". Ids inside an SVG are prefixed with the chart's id (gnuplot names its
// symbols alike in every SVG). Every string from outside (run names, file names, instance names) is escaped.
// Thread-safety: page_html is pure; write_page runs gnuplot (render_svg) and writes files.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/common/report.hpp"
#include "mc/common/status.hpp"
#include "mc/report/chart.hpp"

namespace mc::report {

struct Page {
  std::string title;                            // <title> and <h1>
  std::string subtitle;                         // one line under the title
  RunInfo info;                                 // key/value lines: tool, build, host, inputs, ...
  std::vector<std::vector<std::string>> table;  // a table of figures, header row first; empty: none
  std::vector<Chart> charts;
  std::vector<std::string> notes;  // sentences after the charts (e.g. a chart left out, and why)
};

// `text` with & < > " ' as character references.
std::string html_escape(std::string_view text);
// The SVG of chart `id` ready to sit inside HTML: the XML prolog dropped, gnuplot's ids and references prefixed
// with "<id>-"; the second group of a series (its key sample, drawn again over the plot for an opaque key) is
// "<id>-gnuplot_key_N", the first "<id>-gnuplot_plot_N".
std::string inline_svg(std::string_view svg, std::string_view id);

// The page, with svgs[i] the drawing of page.charts[i] (as render_svg returns them).
// kInvalidArgument when the counts differ.
Result<std::string> page_html(const Page& page, const std::vector<std::string>& svgs);

struct PageOutput {
  std::string html_path;  // "": no page
  std::string svg_dir;    // "": none; else each chart as <dir>/<id>.svg (the directory is created)
  RenderOptions render;
};
// Draws the charts once and writes the page and/or the SVG files, logging (info, stderr) where they are. Errors
// name the file and say why.
Status write_page(const Page& page, const PageOutput& output);

}  // namespace mc::report
