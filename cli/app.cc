// posbias: the command-line tool as a function. Argument parsing (CLI11) and
// the mapping of errors to exit codes live here; the subcommands are in
// *_commands.cc, main() is cli/main.cc.
//
// Exit codes: 0 success (also --help, --version); 1 a check failed
// (check-golden, demo, attention --check) or the run itself failed (out of
// memory, output not writable); 2 bad arguments or input: a command-line
// error, a value the library refuses (std::invalid_argument,
// std::length_error), an unreadable or malformed golden file, a file named by
// an option (--weights, --save, --inputs) that cannot be read or written, a
// program the command runs that is not built (posbias-bench). `posbias
// bench` passes posbias-bench's own exit code through.
// Every error is one line on `err`, "posbias: error: ...".
#include "app.h"

#include <new>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "posbias/limits.h"
#include "commands.h"
#include "golden_check.h"
#include "posbias/version.h"
#include "run_program.h"

namespace posbias::cli {
namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// An error line longer than this is cut (messages quote user values through
// posbias::quoted_name, which shortens them; this is the guard for text that
// reaches a message otherwise, such as CLI11 echoing an unexpected argument).
constexpr std::size_t kMaxErrorBytes = 2000;

// One short line on stderr, whatever the message holds: line breaks become
// spaces, other control bytes are escaped as posbias::quoted_name escapes
// them ("\u001b"), and the line stops after kMaxErrorBytes.
int report_error(std::ostream& err, const std::string& text, int exit_code) {
  std::string message;
  for (const char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '\n' || ch == '\r') {
      message += ' ';
    } else if (byte < 0x20 || byte == 0x7F) {
      const std::string quoted = posbias::quoted_name(std::string_view(&ch, 1));
      message += quoted.substr(1, quoted.size() - 2);  // without the quotes
    } else {
      message += ch;
    }
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  if (message.size() > kMaxErrorBytes) {
    message =
        message.substr(0, kMaxErrorBytes) + "... (" + std::to_string(message.size()) + " bytes)";
  }
  err << "posbias: error: " << message << std::endl;
  return exit_code;
}

std::string command_names(const std::vector<Command>& commands) {
  std::string names;
  for (const auto& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
  return names;
}

int run_command(const Command& command, std::ostream& out, std::ostream& err) {
  int code = 0;
  try {
    code = command.run(out);
  } catch (const std::invalid_argument& e) {
    return report_error(err, e.what(), kExitUsage);
  } catch (const std::length_error& e) {
    return report_error(err, e.what(), kExitUsage);
  } catch (const std::out_of_range& e) {
    return report_error(err, e.what(), kExitUsage);
  } catch (const GoldenFileError& e) {
    return report_error(err, e.what(), kExitUsage);
  } catch (const MissingProgramError& e) {
    return report_error(err, e.what(), kExitUsage);
  } catch (const std::bad_alloc&) {
    return report_error(err, "out of memory", kExitFailure);
  } catch (const std::exception& e) {
    return report_error(err, e.what(), kExitFailure);
  }
  out.flush();
  if (!out) return report_error(err, "could not write the output", kExitFailure);
  return code;
}

}  // namespace

int run(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "posbias: positional biases for attention (ALiBi, Dynamic Position Bias, T5). Start with "
      "`posbias demo`.",
      "posbias"};
  app.set_version_flag("--version", std::string("posbias ") + posbias::version(),
                       "Print the version and exit");
  app.footer("Run `posbias COMMAND --help` for the options of a command.");

  const std::vector<Command> commands = {
      add_demo_command(app),       add_slopes_command(app),    add_alibi_command(app),
      add_alibi_bias_command(app), add_dpb_command(app),       add_t5_command(app),
      add_t5_bucket_command(app),  add_attention_command(app), add_check_golden_command(app),
      add_bench_command(app),
  };
  refuse_empty_values(app);

  // CLI11 would call an unknown command "not expected"; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string name = argv[1];
    bool known = false;
    for (const auto& c : commands) known = known || c.app->get_name() == name;
    if (!known) {
      return report_error(err,
                          "unknown command " + posbias::quoted_name(name) +
                              " (commands: " + command_names(commands) + ")",
                          kExitUsage);
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    out << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> given = app.get_subcommands();
    const std::string help =
        given.empty() ? "posbias --help" : "posbias " + given.back()->get_name() + " --help";
    return report_error(err, std::string(e.what()) + " (see '" + help + "')", kExitUsage);
  } catch (const std::exception& e) {
    return report_error(err, e.what(), kExitUsage);
  }

  for (const auto& c : commands) {
    if (c.app->parsed()) return run_command(c, out, err);
  }
  return report_error(
      err, "no command given (commands: " + command_names(commands) + "; see 'posbias --help')",
      kExitUsage);
}

}  // namespace posbias::cli
