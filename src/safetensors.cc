// safetensors: implemented in issue 3 (in progress).
