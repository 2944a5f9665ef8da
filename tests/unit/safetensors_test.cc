// safetensors tests: issue 3 (in progress).
