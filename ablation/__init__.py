"""The parts of ablate.py (the script keeps its settings and main), a module for each thing they hold:

    ablation.files    where the repo and train.py are; JSON read whole (done.json, meta.json) or one line
    ablation.groups   the grid's groups as data: each group's name and what builds its members
    ablation.grid     the grid built from the groups, a run's train.py arguments and its directory
    ablation.runs     a finished run's figures: its summary, probes, losses and accuracies at other lengths
    ablation.jobs     training the runs: claims (one trainer per run, across nodes), start, finish, the runner
    ablation.report   results.md's tables, results.json and the plots
"""
