"""The in-context search: the loop (`loop`), the variants table it learns from (`variants`) and
its terminal view (`printer`)."""
