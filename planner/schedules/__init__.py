"""The pipeline schedule IR, split by concern; import the public API from `planner.schedule`.

actions (the vocabulary), generators (schedules by name), lowering (sends and receives),
validation (order and deadlock checks), liveness (activations held), csvio (torch's CSV form).
"""
