// Charts of the HTML reports (DESIGN.md §5 "Pictures"; library mc_report_html): a chart is plain data (series of
// (x, y) points, titles, axis labels with units), drawn by gnuplot (Debian's gnuplot-nox, `set terminal svg`), never
// by chart-drawing code of our own. render_svg() writes one gnuplot script with the data inline (datablocks), runs
// gnuplot on it as a child process (no shell, no init file, a deadline, its stderr captured into the error) and
// returns one SVG document per chart.
//
// Every data point is drawn as one SVG element, so a browser test can count them: a point of a kPoints or
// kLinesPoints series is one <use> of a gnuplot point symbol, a bar of a kBars series one <polygon>; each series is
// the group <g id="gnuplot_plot_N"> and has one more such element, its sample in the key (drawn again in a second
// group of the same id, as the key is opaque; page.hpp renames it).
//
// Text that reaches gnuplot (titles, labels, category names, which may come from record files) is reduced to a
// plain character set (chart_text) and single-quoted; numbers are written by us. Nothing read from a file can
// become a gnuplot command.
// Thread-safety: pure functions, except render_svg (a child process and a temporary directory of its own).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mc/common/status.hpp"

namespace mc::report {

enum class SeriesStyle {
  kLinesPoints,  // a line through the points, each point marked
  kPoints,       // markers only (scatter)
  kBars,         // one bar per point at x = the category's index (Chart::categories)
};

struct Series {
  std::string title;  // the key's entry
  SeriesStyle style = SeriesStyle::kLinesPoints;
  std::vector<std::pair<double, double>> points;  // finite values; with a log axis, > 0 on it
  int point_type = 7;                             // gnuplot point type (7: filled circle, 2: cross)
  double point_size = 0.45;
  std::string color;  // "#rrggbb"; empty: the palette's next colour
};

struct Chart {
  std::string id;  // file stem of its SVG and the figure's id: [a-z0-9_-], unique in a page
  std::string title;
  std::string x_label, y_label;  // with units: "TTFT (ms)"
  bool log_x = false, log_y = false;
  bool y_from_zero = true;              // the y axis starts at 0 (unless log_y)
  std::optional<double> y_max;          // e.g. 100 for percentages
  std::vector<std::string> categories;  // kBars: the x axis' labels, category i at x = i ('\n': a line break)
  std::string key = "top left";         // gnuplot key position ("bottom right", "outside right top", ...)
  std::string caption;                  // one or two sentences under it: what is drawn and how it was derived
  std::vector<Series> series;
  int64_t points() const;  // all series' points
};

// gnuplot draws no bar of height 0, so a browser could not find it: bars of value 0 are left out of kBars series
// (a series left with none goes), and the caption says that a missing bar is 0. Returns whether any was left out.
bool drop_zero_bars(Chart& chart);

// `text` reduced to what chart text may contain: letters, digits, space and . , : ; ( ) [ ] + - _ / % * ~ !
// ? and the few UTF-8 signs our labels use (≤ ≥ µ ×); anything else becomes '_'; at most 120 bytes.
std::string chart_text(std::string_view text);

// The gnuplot script drawing `charts` into the files "<id>.svg" of the current directory.
// kInvalidArgument for a chart without series, a series without points, a non-finite value, a non-positive value on
// a log axis, or a bad id.
Result<std::string> gnuplot_script(const std::vector<Chart>& charts, int width_px = 720, int height_px = 420);

struct RenderOptions {
  int width_px = 720, height_px = 420;
  int64_t timeout_ms = 60'000;  // gnuplot is killed after this
  // The gnuplot binary; empty: $MC_GNUPLOT, else "gnuplot" looked up in PATH.
  std::string gnuplot;
};

// One SVG document per chart, in order. kNotFound (with the remedy: apt-get install gnuplot-nox, or set
// MC_GNUPLOT) when there is no gnuplot; kInternal with gnuplot's stderr when it fails; kTimeout when it
// runs past the deadline.
Result<std::vector<std::string>> render_svg(const std::vector<Chart>& charts, const RenderOptions& options = {});

// The gnuplot that render_svg would run ("" with the reason in the Status when none).
Result<std::string> find_gnuplot(const std::string& configured = "");

}  // namespace mc::report
