"""What the chapters import to present their results: numbers glued into the prose, result boxes,
figures, the coding exercises and their checks, quizzes, the step check. The book's build tools
(the Colab edition, publishing, the student versions) are in the checkout's ``tools/``."""
