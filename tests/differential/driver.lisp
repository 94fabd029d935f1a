;;;; driver.lisp -- evaluate every top-level form of a cases file with SBCL
;;;; and write one result line per form.
;;;;
;;;; Usage: sbcl --script driver.lisp CASES-FILE OUTPUT-FILE [--chunks]
;;;; (--chunks: cases separated by ;;@@CASE lines, each read on its own; see bench/ansi_agreement.py)
;;;;
;;;; Line format (one per case, in order):
;;;;   ok V1 ; V2 ; ...   each value printed with PRIN1-TO-STRING
;;;;   ok                 (note the trailing space) for (values)
;;;;   error CLASS        when evaluating the form signalled an ERROR; CLASS is the
;;;;                      first of *ERROR-CLASSES* the condition is of
;;;; Inside a line each backslash is doubled and each newline becomes the
;;;; two characters \n.  The number of cases is printed to stderr.

(in-package :cl-user)

(defun %escape-line (s)
  (with-output-to-string (out)
    (loop for ch across s
          do (cond ((char= ch #\\) (write-string "\\\\" out))
                   ((char= ch #\Newline) (write-string "\\n" out))
                   (t (write-char ch out))))))

(defun %join-values (strings)
  (with-output-to-string (out)
    (write-string "ok " out)
    (loop for (s . more) on strings
          do (write-string s out)
             (when more (write-string " ; " out)))))

(defun %pprint-cons (stream obj)
  "Print a list on one line; abbreviate (quote x) as 'x and (function x) as #'x.
SBCL's standard pprint table breaks code-like lists (if, let, ...) across lines
even with a huge right margin, so conses get this printer instead."
  (let ((head (car obj)))
    (if (and (member head '(quote function))
             (consp (cdr obj))
             (null (cddr obj)))
        (progn (write-string (if (eq head 'quote) "'" "#'") stream)
               (write (cadr obj) :stream stream))
        (progn
          (write-char #\( stream)
          (loop
            (write (car obj) :stream stream)
            (let ((more (cdr obj)))
              (cond ((null more) (return))
                    ((consp more) (write-char #\Space stream) (setq obj more))
                    (t (write-string " . " stream)
                       (write more :stream stream)
                       (return)))))
          (write-char #\) stream)))))

(defparameter *case-pprint-dispatch*
  (let ((table (copy-pprint-dispatch nil)))
    (set-pprint-dispatch 'cons #'%pprint-cons 100 table)
    table))

(defparameter *error-classes*
  '(unbound-variable undefined-function division-by-zero floating-point-overflow arithmetic-error
    type-error program-error control-error parse-error stream-error cell-error error)
  "The classes an error is recorded under, most specific first.")

(defun %error-class (condition)
  (string-downcase (symbol-name (find-if (lambda (class) (typep condition class)) *error-classes*))))

(defun %run-one (form)
  "Evaluate FORM; return the result line (unescaped)."
  (let ((sink (make-broadcast-stream)))
    (handler-case
        (let ((vals (let ((*standard-output* sink)
                          (*error-output* sink)
                          (*trace-output* sink))
                      (handler-bind ((warning #'muffle-warning))
                        (multiple-value-list (eval form))))))
          (%join-values (mapcar #'prin1-to-string vals)))
      (error (c) (concatenate 'string "error " (%error-class c))))))

(defun %chunks (text)
  "TEXT split at each line ;;@@CASE (bench/ansi_agreement.py's case files): one string per case."
  (let ((out nil) (start 0) (sep (format nil ";;@@CASE~%")))
    (loop for p = (search sep text :start2 start)
          do (push (subseq text start (or p (length text))) out)
             (if p (setf start (+ p (length sep))) (return)))
    (remove-if (lambda (s) (every (lambda (c) (member c '(#\Space #\Newline #\Tab))) s)) (nreverse out))))

(defun %chunk-line (chunk)
  "The result line of a case that may be several forms (its last one's), a reader error or
a form that runs past 20 seconds."
  (let ((forms (handler-case (with-input-from-string (s chunk)
                               (loop for f = (read s nil s) until (eq f s) collect f))
                 (error () :reader-error))))
    (if (eq forms :reader-error)
        "error reader"
        (let ((line "ok "))
          (dolist (f forms line)
            (setf line (handler-case (sb-ext:with-timeout 20 (%run-one f))
                         (sb-ext:timeout () "error timeout"))))))))

(defun %main (cases-path out-path chunks)
  "Each form of CASES-PATH (with CHUNKS, each ;;@@CASE case) evaluated in order; one result
line per case written to OUT-PATH."
  (let ((count 0)
        (eof (list :eof)))
    (with-open-file (in cases-path :direction :input :external-format :utf-8)
      (with-open-file (out out-path :direction :output :if-exists :supersede
                                    :external-format :utf-8)
        (let ((*package* (find-package :cl-user))
              (*read-default-float-format* 'double-float)
              (*read-eval* (if chunks t nil))
              (*read-base* 10)
              (*print-case* :downcase)
              (*print-pretty* t)
              (*print-pprint-dispatch* *case-pprint-dispatch*)
              (*print-right-margin* 100000)
              (*print-circle* nil)
              (*print-readably* nil)
              (*print-escape* t)
              (*print-base* 10)
              (*print-radix* nil)
              (*print-length* nil)
              (*print-level* nil)
              (*print-lines* nil)
              (*print-array* t)
              (*print-gensym* t))
          (if chunks
              (let ((text (make-string (file-length in))))
                (dolist (chunk (%chunks (subseq text 0 (read-sequence text in))))
                  (incf count)
                  (write-line (%escape-line (%chunk-line chunk)) out)))
              (loop for form = (read in nil eof)
                    until (eq form eof)
                    do (incf count)
                       (write-line (%escape-line (%run-one form)) out))))))
    (format *error-output* "cases: ~d~%" count)
    (finish-output *error-output*)
    count))

(let ((args (rest sb-ext:*posix-argv*)))
  (unless (or (= (length args) 2) (and (= (length args) 3) (string= (third args) "--chunks")))
    (format *error-output* "usage: sbcl --script driver.lisp CASES OUT [--chunks]~%")
    (sb-ext:exit :code 2))
  (%main (first args) (second args) (= (length args) 3)))
