// A header for the test of docs/check_documented.py: everything here is
// documented or exempt except `int undocumented_function(int x);`, which the
// checker must report (and nothing else).
#ifndef FIXTURE_H_
#define FIXTURE_H_

#include <cstdint>

namespace fixture {

/// A documented function.
int documented(int x);

/// A group under one comment: both are documented.
int first_of_group();
int second_of_group();

int trailing();  ///< documented by a trailing comment

/// A documented class.
class Widget {
 public:
  /// Documented constructor.
  explicit Widget(int n);
  Widget(const Widget&) = default;  // exempt anyway
  Widget& operator=(const Widget&) = delete;

  /// An inline body is skipped.
  int size() const {
    if (n_ > 0) {
      return n_;
    }
    return 0;
  }

 private:
  int hidden_helper();  // private: not checked
  int n_ = 0;
};

/// A documented enum; its enumerators are not checked.
enum class Kind : std::uint8_t {
  kA,
  kB,
};

namespace detail {
int internal_helper();  // not public
}  // namespace detail

int undocumented_function(int x);

}  // namespace fixture

#endif  // FIXTURE_H_
