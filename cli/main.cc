// posbias: the command-line tool. Everything but main() is in app.cc.
#include <iostream>

#include "app.h"

int main(int argc, char** argv) { return posbias::cli::run(argc, argv, std::cout, std::cerr); }
