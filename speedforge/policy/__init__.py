"""The policy: exemplar sampling, contrastive prompts (package data), response parsing and
generation backends (`hf`, `openai`), plus an OpenAI-compatible server for local models."""
