// KeptFigures of one evenly split tensor dim, by counting coordinates digit by digit
// (detail::kept_by_digits). See detail/kept_pieces.hpp.
#include <tessera/sharding/detail/kept_pieces.hpp>
#include <tessera/sharding/detail/rank_classes.hpp>

#include <algorithm>
#include <cstdlib>

namespace tessera::detail {

namespace {

// An even split puts a rank's piece at the sum, over the mesh dims of the dim's shard order, of
// the rank's coordinate times the length of a piece at that mesh dim's level: per mesh dim that
// length (0 for a mesh dim not in the order).
std::vector<int64_t> level_lengths(const Layout& layout, int64_t d) {
  std::vector<int64_t> out(static_cast<size_t>(layout.mesh().ndim()), 0);
  int64_t length = layout.global_shape()[d];
  for (int64_t m : layout.shard_order(d)) {
    length /= layout.mesh().shape()[m];
    out[static_cast<size_t>(m)] = length;
  }
  return out;
}

// Coordinates at which, for every tensor dim t, the sum over mesh dims of coordinate times
// step[t] lies in [lo[t], hi[t]]. The digits go from the largest step (relative to its
// interval) down; a digit whose rest lies wholly inside every interval (or outside one) counts
// its coordinates at once, so only those straddling an end are visited further. Those are a
// few per digit where the steps are the differences of two mixed radixes (the pieces' levels),
// whatever the rank count; past `budget` visits it gives up.
class DigitCount {
 public:
  struct Digit {
    std::vector<int64_t> steps;  // per tensor dim
    int64_t size;                // the mesh dim's
  };

  DigitCount(std::vector<Digit> digits, std::vector<int64_t> lo, std::vector<int64_t> hi, int64_t budget)
      : digits_(std::move(digits)), lo_(std::move(lo)), hi_(std::move(hi)), budget_(budget) {
    const size_t dims = lo_.size();
    const auto weight = [&](const Digit& g) {
      double most = 0;
      for (size_t t = 0; t < dims; ++t)
        most = std::max(most, std::abs(static_cast<double>(g.steps[t])) / static_cast<double>(hi_[t] - lo_[t] + 1));
      return most;
    };
    std::stable_sort(digits_.begin(), digits_.end(), [&](const Digit& a, const Digit& b) { return weight(a) > weight(b); });
    const size_t n = digits_.size();
    low_.assign(n + 1, std::vector<int64_t>(dims, 0));
    high_.assign(n + 1, std::vector<int64_t>(dims, 0));
    coordinates_.assign(n + 1, 1);
    for (size_t i = n; i-- > 0;) {
      for (size_t t = 0; t < dims; ++t) {
        const int64_t reach = digits_[i].steps[t] * (digits_[i].size - 1);
        low_[i][t] = low_[i + 1][t] + std::min<int64_t>(0, reach);
        high_[i][t] = high_[i + 1][t] + std::max<int64_t>(0, reach);
      }
      coordinates_[i] = coordinates_[i + 1] * digits_[i].size;
    }
  }

  std::optional<int64_t> count() {
    std::vector<int64_t> sums(lo_.size(), 0);
    const int64_t n = count(0, sums);
    return visits_ > budget_ ? std::nullopt : std::optional<int64_t>(n);
  }

 private:
  // The values of a digit, [first, last], as an interval (empty when first > last).
  struct Values {
    int64_t first, last;
    Values meet(Values o) const { return {std::max(first, o.first), std::min(last, o.last)}; }
    int64_t size() const { return std::max<int64_t>(0, last - first + 1); }
  };

  // The values v in [0, size) at which least <= x + v * step <= most.
  static Values where(int64_t x, int64_t step, int64_t least, int64_t most, int64_t size) {
    const auto floor_div = [](int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0)) ? 1 : 0); };
    const auto ceil_div = [&](int64_t a, int64_t b) { return -floor_div(-a, b); };
    if (step == 0) return least <= x && x <= most ? Values{0, size - 1} : Values{0, -1};
    Values v = step > 0 ? Values{ceil_div(least - x, step), floor_div(most - x, step)}
                        : Values{ceil_div(most - x, step), floor_div(least - x, step)};
    return v.meet({0, size - 1});
  }

  int64_t count(size_t i, std::vector<int64_t>& sums) {
    bool inside = true;
    for (size_t t = 0; t < sums.size(); ++t) {
      if (sums[t] + high_[i][t] < lo_[t] || sums[t] + low_[i][t] > hi_[t]) return 0;
      inside = inside && sums[t] + low_[i][t] >= lo_[t] && sums[t] + high_[i][t] <= hi_[t];
    }
    if (inside) return coordinates_[i];
    if (++visits_ > budget_) return 0;
    // This digit's values whose rest meets every interval, and those whose rest lies inside all:
    // the latter count at once, the others (near an interval's end) are visited.
    const Digit& g = digits_[i];
    Values meets{0, g.size - 1}, within{0, g.size - 1};
    for (size_t t = 0; t < sums.size(); ++t) {
      const int64_t least = sums[t] + low_[i + 1][t], most = sums[t] + high_[i + 1][t], step = g.steps[t];
      meets = meets.meet(where(least, step, kFar.first, hi_[t], g.size)).meet(where(most, step, lo_[t], kFar.second, g.size));
      within = within.meet(where(least, step, lo_[t], kFar.second, g.size)).meet(where(most, step, kFar.first, hi_[t], g.size));
    }
    int64_t n = within.size() * coordinates_[i + 1];
    const auto visit = [&](Values values) {
      for (int64_t v = values.first; v <= values.last; ++v) {
        for (size_t t = 0; t < sums.size(); ++t) sums[t] += v * g.steps[t];
        n += count(i + 1, sums);
        for (size_t t = 0; t < sums.size(); ++t) sums[t] -= v * g.steps[t];
      }
    };
    if (within.size() == 0) {
      visit(meets);
    } else {
      visit({meets.first, within.first - 1});
      visit({within.last + 1, meets.last});
    }
    return n;
  }

  static constexpr std::pair<int64_t, int64_t> kFar{-(int64_t{1} << 62), int64_t{1} << 62};  // no bound

  std::vector<Digit> digits_;
  std::vector<int64_t> lo_, hi_;
  int64_t budget_;
  std::vector<std::vector<int64_t>> low_, high_;  // per suffix of digits, per tensor dim
  std::vector<int64_t> coordinates_;              // per suffix of digits
  int64_t visits_ = 0;
};

}  // namespace

std::optional<KeptFigures> kept_by_digits(const Layout& held, const Layout& want, const std::vector<int64_t>& dims,
                                          int64_t budget) {
  // The dims split in either layout, evenly in both, into pieces one of whose lengths is a
  // multiple of the other's: a rank keeps its whole smaller piece there or nothing, from a fixed
  // number of source pieces. The others whole in both, and not empty.
  std::vector<int64_t> split, lo, hi;
  int64_t kept = 1, wanted = 1, blocks = 1;
  for (int64_t d : dims) {
    const int64_t length = want.global_shape()[d];
    if (held.shard_order(d).empty() && want.shard_order(d).empty()) {
      if (length == 0) return std::nullopt;
      kept *= length;
      wanted *= length;
      continue;
    }
    if (!evenly_split(held, d) || !evenly_split(want, d)) return std::nullopt;
    const int64_t held_piece = length / held.piece_count(d), want_piece = length / want.piece_count(d);
    if (held_piece % want_piece != 0 && want_piece % held_piece != 0) return std::nullopt;
    split.push_back(d);
    // The keeping interval of the difference of starts (below).
    lo.push_back(1 - held_piece);
    hi.push_back(want_piece - 1);
    kept *= std::min(held_piece, want_piece);
    wanted *= want_piece;
    blocks *= std::max<int64_t>(1, want_piece / held_piece);
  }
  if (split.empty()) return std::nullopt;

  // A rank keeps something where, in every split dim, its held piece starts less than a held
  // piece before its wanted piece's start and less than a wanted piece after it: both starts are
  // sums over mesh dims, so their difference is one, with per mesh dim the difference of the
  // level lengths.
  const MeshSpec& mesh = want.mesh();
  std::vector<DigitCount::Digit> digits(static_cast<size_t>(mesh.ndim()));
  for (int64_t d : split) {
    const std::vector<int64_t> held_levels = level_lengths(held, d), want_levels = level_lengths(want, d);
    for (int64_t m = 0; m < mesh.ndim(); ++m)
      digits[static_cast<size_t>(m)].steps.push_back(held_levels[static_cast<size_t>(m)] - want_levels[static_cast<size_t>(m)]);
  }
  int64_t free = 1;  // coordinates of the mesh dims that move no start
  std::vector<DigitCount::Digit> moving;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    DigitCount::Digit& g = digits[static_cast<size_t>(m)];
    g.size = mesh.shape()[m];
    const bool moves = std::any_of(g.steps.begin(), g.steps.end(), [](int64_t s) { return s != 0; });
    if (moves && g.size > 1) moving.push_back(std::move(g));
    else free *= g.size;
  }
  const auto counted = DigitCount(std::move(moving), std::move(lo), std::move(hi), budget).count();
  if (!counted) return std::nullopt;
  const int64_t keepers = *counted * free, ranks = mesh.size();

  KeptFigures out;
  out.least_kept = keepers == ranks ? kept : 0;
  out.most_lacking = wanted - out.least_kept;
  out.kept_sum = keepers * kept;
  out.wanted_sum = ranks * wanted;
  out.keeping_blocks = keepers > 0 ? blocks : -1;
  out.empty_blocks = keepers < ranks ? blocks : -1;
  return out;
}

}  // namespace tessera::detail
