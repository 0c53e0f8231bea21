"""OpenAI-compatible HTTP server in front of any InferenceEngine (`thermik inference`).

`build_app(engine, tokenizer, model_name)` returns the FastAPI app; `serve(cfg)` loads a model and runs it
with uvicorn. Importing this package imports neither FastAPI nor torch.
"""
