// The bound every size check of posbias compares with, and how posbias
// shows user-given text in its messages. Public so that the tools and front
// ends on top of the library (the posbias command-line tool, an engine's
// own error paths) refuse sizes and echo names exactly as the core does.
#ifndef POSBIAS_LIMITS_H_
#define POSBIAS_LIMITS_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace posbias {

/// The physical memory of this machine in bytes (sysconf(_SC_PHYS_PAGES) x
/// the page size, read once and cached). Every call of the library that
/// sizes memory from its arguments refuses, with std::length_error, a
/// request whose bytes exceed it before allocating anything. Thread-safe.
std::size_t physical_memory_bytes();

/// `text` (a state-dict key, a tensor name from a file, a value given on a
/// command line) as posbias's messages show it: in double quotes, escaped as
/// JSON escapes strings (\" \\ \n \t \r, other control bytes, DEL and the C1
/// controls as \u00XX), bytes that are not UTF-8 as \xNN, and shortened to
/// about 120 characters followed by `..." (N bytes)`. An empty text is "".
/// So a control byte cannot garble a terminal and a megabyte-long name
/// cannot make a megabyte-long error line. Never throws (but std::bad_alloc).
///
///   posbias::quoted_name("a\nb");  // "\"a\\nb\""
std::string quoted_name(std::string_view text);

}  // namespace posbias

#endif  // POSBIAS_LIMITS_H_
