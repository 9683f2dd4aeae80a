// How often drafts are accepted, by grade. A draft's grade is its
// proposal's match (Draft::match: how long the text it continues agrees
// with its source; 0 for drafters that do not grade) plus its index in the
// proposal, capped at kGrades - 1: graded drafters' drafts are accepted more
// often the longer that agreement. Counts fade by `decay` at each judgement
// of their grade, so an estimate follows the text being written.
#pragma once

#include <algorithm>
#include <vector>

namespace megakern {

class GradedAcceptance {
 public:
  static constexpr int kGrades = 40;
  explicit GradedAcceptance(double decay) : decay_(decay), judged_(kGrades, 0.0), accepted_(kGrades, 0.0) {}

  static int grade(int match, int index) { return std::clamp(match + index, 0, kGrades - 1); }
  // Draft `index` of a proposal of grade `match` was judged: accepted or not.
  void judge(int match, int index, bool ok) {
    const size_t g = static_cast<size_t>(grade(match, index));
    judged_[g] = judged_[g] * decay_ + 1.0;
    accepted_[g] = accepted_[g] * decay_ + (ok ? 1.0 : 0.0);
  }
  // The chance that such a draft is accepted once those before it were: the
  // counts at its grade, leaning on all grades together (with the weight of
  // one judgement) while it has few; 0.5 before anything was judged.
  double alpha(int match, int index) const {
    double all_j = 0, all_a = 0;
    for (int i = 0; i < kGrades; ++i) {
      all_j += judged_[static_cast<size_t>(i)];
      all_a += accepted_[static_cast<size_t>(i)];
    }
    const double prior = (all_a + 1.0) / (all_j + 2.0);
    const size_t g = static_cast<size_t>(grade(match, index));
    return std::clamp((accepted_[g] + prior) / (judged_[g] + 1.0), 0.0, 0.99);
  }
  // Scales every count by f (what was judged keeps that weight).
  void fade(double f) {
    for (double& j : judged_) j *= f;
    for (double& a : accepted_) a *= f;
  }

 private:
  double decay_;
  std::vector<double> judged_, accepted_;
};

}  // namespace megakern
