"""Speech to text: /v1/audio/transcriptions and /v1/audio/translations (OpenAI's shapes)
over `task: transcribe` models (docs/audio.md)."""
