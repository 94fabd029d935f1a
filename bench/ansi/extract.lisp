;;;; extract.lisp -- the cases of an ANSI-test file, for bench/ansi_agreement.py.
;;;;
;;;; Usage: sbcl --script extract.lisp TEST-FILE CASES-FILE
;;;;
;;;; Writes the test form of each (deftest NAME FORM EXPECTED...) of TEST-FILE, as its source
;;;; text, and each top-level definition the tests may use (defun, defmacro, defvar,
;;;; defparameter, defconstant, defstruct), each after a line ;;@@CASE. Anything else at top
;;;; level (in-package, the suite's own test-defining macros ...) is left out. The number of
;;;; cases goes to stderr.

(defparameter *definitions* '("DEFUN" "DEFMACRO" "DEFVAR" "DEFPARAMETER" "DEFCONSTANT" "DEFSTRUCT"))

(defun slurp (path)
  (with-open-file (s path :external-format :latin-1)
    (let ((text (make-string (file-length s))))
      (subseq text 0 (read-sequence text s)))))

(defun write-case (text out)
  (write-line ";;@@CASE" out)
  (write-line text out))

(defun extract (in-path out-path)
  (let ((text (slurp in-path)) (count 0) (*read-suppress* nil))
    (with-open-file (in in-path :external-format :latin-1)
      (with-open-file (out out-path :direction :output :if-exists :supersede :external-format :utf-8)
        (loop
          (let ((c (peek-char t in nil :eof)))
            (cond ((eq c :eof) (return))
                  ((char= c #\;) (read-line in))
                  ((char= c #\()
                   (let ((start (file-position in)))
                     (read-char in)
                     (let ((head (handler-case (read in) (error () nil))))
                       (cond ((and (symbolp head) (string= (symbol-name head) "DEFTEST"))
                              (read in)  ; the name
                              (peek-char t in)
                              (let ((form-start (file-position in)))
                                (read in)
                                (let ((form-end (file-position in)))
                                  (read-delimited-list #\) in)
                                  (incf count)
                                  (write-case (subseq text form-start form-end) out))))
                             ((and (symbolp head) (member (symbol-name head) *definitions* :test #'string=))
                              (read-delimited-list #\) in)
                              (incf count)
                              (write-case (subseq text start (file-position in)) out))
                             (t (let ((*read-suppress* t)) (read-delimited-list #\) in)))))))
                  (t (let ((*read-suppress* t)) (read in))))))))
    (format *error-output* "~d~%" count)))

(let ((args (rest sb-ext:*posix-argv*)))
  (unless (= (length args) 2)
    (format *error-output* "usage: sbcl --script extract.lisp TEST-FILE CASES-FILE~%")
    (sb-ext:exit :code 2))
  (extract (first args) (second args)))
