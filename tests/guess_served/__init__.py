"""The guessing env in OpenEnv's own layout: the environment in server/-like `environment.py` whose step() takes any
Action, and `app.py` beside it serving it with its action class: in-process, the action type comes from that app's
/schema."""
