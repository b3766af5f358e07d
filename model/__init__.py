"""A SPIN model of the delivery protocol and its checker (issue 20); see docs/model.md.

Not part of the installed package: ``model/check.py`` runs as a script, and the tests
import it from the repository.
"""
