// Time and peak resident memory of work run in a child process, so that what
// the parent holds (its heap, the tool's other results) does not count. Used
// by `posbias demo` (attention materialised vs fused) and by the attention
// suite's memory case.
//
// The child resets its high-water mark (/proc/self/clear_refs 5) and takes
// its VmRSS as the base before the work, and reads VmHWM after it; the
// difference comes back through a pipe. (Subtracting the parent's RSS from a
// child's ru_maxrss is systematically low: a forked child counts only the
// pages it touches, while the parent's RSS includes file-backed pages.)
// Linux only.
#ifndef POSBIAS_BENCHMARKS_CHILD_MEASURE_H_
#define POSBIAS_BENCHMARKS_CHILD_MEASURE_H_

#include <functional>
#include <string>
#include <vector>

namespace posbias::bench {

/// A field of /proc/self/status in bytes (VmRSS, VmHWM: reported in kB), or
/// -1 when it cannot be read.
double proc_status_bytes(const char* field);

/// What the work in the child reports back.
class ChildReport {
 public:
  explicit ChildReport(int fd);
  /// One timed run, in milliseconds (the parent's on_time sees it at once).
  void time_ms(double ms);
  /// Starts the peak over: resets the high-water mark and takes VmRSS now
  /// as the base (done once before the work; call it again after a warm-up
  /// that should not count).
  void restart_peak();
  /// VmRSS at the last restart_peak(), bytes (-1 if unreadable).
  double base_bytes() const { return base_bytes_; }

 private:
  int fd_;
  double base_bytes_ = -1;
};

/// What the parent gets back.
struct ChildResult {
  bool ok = false;             // the work returned and the child exited 0
  std::string error;           // why not, when !ok
  std::vector<double> times_ms;
  double peak_growth = -1;     // VmHWM after the work - the base, bytes; -1 if unreadable
};

/// Runs `work` in a forked child process and waits for it. `on_time`, when
/// given, is called in the parent with each time as the child reports it
/// (for a progress display). Anything `work` throws fails the run with the
/// exception's message. Output buffered in std::cout is flushed first.
ChildResult run_in_child(const std::function<void(ChildReport&)>& work,
                         const std::function<void(double ms)>& on_time = nullptr);

}  // namespace posbias::bench

#endif  // POSBIAS_BENCHMARKS_CHILD_MEASURE_H_
