#include <tessera/debug/visualize_sharding.hpp>
#include <tessera/spec/partition_spec.hpp>

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include <tessera/core/error.hpp>

namespace tessera {

namespace {

using Range = std::pair<int64_t, int64_t>;  // [begin, end) along one tensor dim

// Long replica lists wrap so a fully replicated tensor on many ranks stays a readable width.
constexpr size_t kRanksPerLine = 8;

// "rank 0, 1" (wrapped, continuation lines aligned under the first rank).
std::vector<std::string> rank_lines(const std::vector<int>& ranks) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < ranks.size(); i += kRanksPerLine) {
    std::string line = i == 0 ? "rank " : "     ";
    for (size_t j = i; j < std::min(ranks.size(), i + kRanksPerLine); ++j)
      line += std::to_string(ranks[j]) + (j + 1 < ranks.size() ? ", " : "");
    while (!line.empty() && line.back() == ' ') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

std::string join(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out.append(i ? ", " : "").append(std::to_string(ranks[i]));
  return out;
}

}  // namespace

std::string visualize_sharding(const Layout& layout) {
  const int64_t ndim = layout.ndim();
  TESSERA_CHECK(ndim == 1 || ndim == 2, ShardingError, "visualize_sharding", "cannot show the ", ndim, "-d tensor ",
                layout.to_string(), "; only 1-d and 2-d tensors are supported");

  // A 1-d tensor is drawn as a grid of one row: its only range is the column range.
  auto row_of = [&](const Block& b) { return ndim == 2 ? Range{b.begin[0], b.end[0]} : Range{0, 0}; };
  auto col_of = [&](const Block& b) { return Range{b.begin[ndim - 1], b.end[ndim - 1]}; };

  struct Cell {
    Block block;
    std::vector<int> ranks;
  };
  std::map<std::pair<Range, Range>, Cell> cells;
  std::vector<Range> rows, cols;
  std::vector<int> empty;
  std::vector<int> ranks = layout.mesh().ranks();
  std::sort(ranks.begin(), ranks.end());  // cells list world ranks ascending, whatever the mesh order
  for (int r : ranks) {
    const Block b = layout.block_of_rank(r);
    if (b.numel() == 0) {
      empty.push_back(r);
      continue;
    }
    Cell& cell = cells[{row_of(b), col_of(b)}];
    cell.block = b;
    cell.ranks.push_back(r);
    rows.push_back(row_of(b));
    cols.push_back(col_of(b));
  }
  for (auto* v : {&rows, &cols}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }

  // Lines of each cell, then each column's width and each row's height.
  std::vector<std::vector<std::vector<std::string>>> text(rows.size(), std::vector<std::vector<std::string>>(cols.size()));
  std::vector<size_t> width(cols.size(), 0), height(rows.size(), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < cols.size(); ++j) {
      auto it = cells.find({rows[i], cols[j]});
      // Every (row, column) pair is some rank's block for a Layout; a gap stays a blank cell.
      if (it == cells.end()) continue;
      std::vector<std::string>& lines = text[i][j];
      lines.push_back(it->second.block.to_string());
      for (std::string& line : rank_lines(it->second.ranks)) lines.push_back(std::move(line));
      for (const std::string& line : lines) width[j] = std::max(width[j], line.size());
      height[i] = std::max(height[i], lines.size());
    }
  }

  std::ostringstream out;
  out << layout.to_string();
  if (!layout.has_partial()) out << " = " << spec_from_layout(layout).to_string();  // its PartitionSpec
  if (!cols.empty()) {
    std::string border = "+";
    for (size_t w : width) border += std::string(w + 2, '-') + "+";
    out << '\n' << border;
    for (size_t i = 0; i < rows.size(); ++i) {
      for (size_t k = 0; k < height[i]; ++k) {
        out << "\n|";
        for (size_t j = 0; j < cols.size(); ++j) {
          const std::string line = k < text[i][j].size() ? text[i][j][k] : "";
          out << ' ' << line << std::string(width[j] - line.size(), ' ') << " |";
        }
      }
      out << '\n' << border;
    }
  }
  const Placements& placements = layout.placements();
  for (size_t k = 0; k < placements.size(); ++k)
    if (is_partial(placements[k]))
      out << '\n' << tessera::to_string(placements[k]) << " over mesh dim " << k << " ("
          << layout.mesh().names()[k] << "): ranks in a cell hold partial values";
  if (!empty.empty()) out << "\nempty: rank " << join(empty);
  return out.str();
}

}  // namespace tessera
