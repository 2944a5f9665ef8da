// t5 tests: issue 3 (in progress).
