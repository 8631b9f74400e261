"""Predictions and verdicts, by what they predict: memory (bytes), comm (collectives), time (seconds),
policy (which setting), verdicts (prediction beside observation); imports point down that order."""
