// posbias: the command-line tool. Argument parsing (CLI11) and the mapping of
// errors to exit codes live here; the subcommands are in *_commands.cc.
//
// Exit codes: 0 success (also --help, --version); 1 a check failed
// (check-golden, demo, attention --check) or the run itself failed (out of
// memory, output not writable); 2 bad arguments or input: a command-line
// error, a value the library refuses (std::invalid_argument,
// std::length_error), an unreadable or malformed golden file, a file named by
// an option (--weights, --save, --inputs) that cannot be read or written. Every error is one line on stderr,
// "posbias: error: ...".
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.h"
#include "golden_check.h"
#include "posbias/version.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// One line on stderr, whatever the message holds.
int report_error(std::string message, int exit_code) {
  for (char& ch : message) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  while (!message.empty() && message.back() == ' ') message.pop_back();
  std::cerr << "posbias: error: " << message << std::endl;
  return exit_code;
}

std::string command_names(const std::vector<posbias::cli::Command>& commands) {
  std::string names;
  for (const auto& c : commands) names += (names.empty() ? "" : ", ") + c.app->get_name();
  return names;
}

int run_command(const posbias::cli::Command& command) {
  int code = 0;
  try {
    code = command.run(std::cout);
  } catch (const std::invalid_argument& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const std::length_error& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const std::out_of_range& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const posbias::cli::GoldenFileError& e) {
    return report_error(e.what(), kExitUsage);
  } catch (const std::bad_alloc&) {
    return report_error("out of memory", kExitFailure);
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitFailure);
  }
  std::cout.flush();
  if (!std::cout) return report_error("could not write the output", kExitFailure);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = posbias::cli;
  CLI::App app{
      "posbias: positional biases for attention (ALiBi, Dynamic Position Bias, T5). Start with "
      "`posbias demo`.",
      "posbias"};
  app.set_version_flag("--version", std::string("posbias ") + posbias::version(),
                       "Print the version and exit");
  app.footer("Run `posbias COMMAND --help` for the options of a command.");

  const std::vector<cli::Command> commands = {
      cli::add_demo_command(app),         cli::add_slopes_command(app),
      cli::add_alibi_command(app),        cli::add_alibi_bias_command(app),
      cli::add_dpb_command(app),          cli::add_t5_command(app),
      cli::add_t5_bucket_command(app),    cli::add_attention_command(app),
      cli::add_check_golden_command(app), cli::add_bench_command(app),
  };

  // CLI11 would call an unknown command "not expected"; name it instead.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string name = argv[1];
    bool known = false;
    for (const auto& c : commands) known = known || c.app->get_name() == name;
    if (!known) {
      return report_error(
          "unknown command '" + name + "' (commands: " + command_names(commands) + ")", kExitUsage);
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    const std::vector<CLI::App*> given = app.get_subcommands();
    const std::string help =
        given.empty() ? "posbias --help" : "posbias " + given.back()->get_name() + " --help";
    return report_error(std::string(e.what()) + " (see '" + help + "')", kExitUsage);
  } catch (const std::exception& e) {
    return report_error(e.what(), kExitUsage);
  }

  for (const auto& c : commands) {
    if (c.app->parsed()) return run_command(c);
  }
  return report_error(
      "no command given (commands: " + command_names(commands) + "; see 'posbias --help')",
      kExitUsage);
}
