// t5: implemented in issue 3 (in progress).
