"""Training the difficulty estimator: labels from outcome tables and logs,
training runs, evaluation (APGR, CPT, AUC, ECE), MLflow registration and
promotion. Needs the ``train`` extra.
"""
