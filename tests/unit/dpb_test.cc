// dpb tests: issue 3 (in progress).
