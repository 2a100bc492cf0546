"""The book's own tooling, out of the algorithm's way: numbers glued into the prose, figures, the
coding exercises and their checks, quizzes, the step check, the Colab edition, publishing and the
student versions."""
